#!/usr/bin/env bash
# Caddy with pushlb's module (caddy/cmd/caddy) against Caddy's own
# configuration, in one caddy process, loaded with wrk in alternating
# rounds:
#
#   small (4 instances of one service):
#     static           reverse_proxy with the 4 addresses (Caddy's random)
#     dynamic          dynamic pushlb (Caddy's random)
#     dynamic+pushlb   dynamic pushlb, lb_policy pushlb (ZoneAvoidance)
#   large (1,000 instances):
#     static+least_conn    1,000 addresses, lb_policy least_conn
#     static+pushlb        1,000 addresses, lb_policy pushlb {rule BestAvailable}
#     dynamic+least_conn   dynamic pushlb, lb_policy least_conn
#     dynamic+pushlb       dynamic pushlb {rule BestAvailable}, lb_policy pushlb
#
# Prints req/s, p50 and p99 of every round, their medians, and the
# ratios: dynamic over static (the goal: >= 0.97x), pushlb's policy over
# least_conn.
#
#   bash bench/caddy.sh
#   ROUNDS=3 DURATION=10s CONNS=32 THREADS=1 bash bench/caddy.sh
#
# The instances are served and announced by cmd/fleet (one process, one
# listener each); NATS is the gateway's embedded server. Installs wrk with
# apt-get when it is missing (Debian). Ports are on 127.0.0.1 from
# BASE_PORT (default 19300: 19300-19310 and the instances' 19400-19403
# and 20000-20999); every process is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")"
bench=$(pwd)
root=$(cd .. && pwd)

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}
BASE_PORT=${BASE_PORT:-19300}
SMALL_PORT=${SMALL_PORT:-19400}
LARGE_PORT=${LARGE_PORT:-20000}
LARGE=${LARGE:-1000}
NATS_PORT=$((BASE_PORT + 10))

if ! command -v wrk >/dev/null; then
	echo "== apt-get install wrk"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi

. ./processes.sh # the working directory is bench/ (cd above)

echo "== build (into $tmp/bin)"
mkdir -p "$tmp/bin"
(cd "$root" && go build -o "$tmp/bin/" ./cmd/gateway)
(cd "$root/caddy" && go build -o "$tmp/bin/caddy" ./cmd/caddy)
go build -o "$tmp/bin/fleet" ./cmd/fleet

# waitfor URL: until URL answers 200 (20 s).
waitfor() {
	for _ in $(seq 200); do
		if curl -fsS -m 1 -o /dev/null "$1" 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "no answer from $1; logs in $tmp:" >&2
	tail -n 20 "$tmp"/*.log >&2 || true
	return 1
}

echo "== NATS (the gateway's embedded server on :$NATS_PORT) and the fleets"
"$tmp/bin/gateway" -listen "127.0.0.1:$((NATS_PORT + 1))" -admin "127.0.0.1:$((NATS_PORT + 2))" \
	-embedded-nats "127.0.0.1:$NATS_PORT" -data-dir "$tmp/gateway-data" -log-level warn >"$tmp/gateway.log" 2>&1 &
pids+=($!)
waitfor "http://127.0.0.1:$((NATS_PORT + 2))/readyz"
nats=nats://127.0.0.1:$NATS_PORT
"$tmp/bin/fleet" -nats "$nats" -service small -n 4 -port "$SMALL_PORT" >"$tmp/fleet-small.log" 2>&1 &
pids+=($!)
"$tmp/bin/fleet" -nats "$nats" -service large -n "$LARGE" -port "$LARGE_PORT" >"$tmp/fleet-large.log" 2>&1 &
pids+=($!)
for f in small large; do
	for _ in $(seq 600); do grep -q '^ready' "$tmp/fleet-$f.log" && break; sleep 0.1; done
	grep -q '^ready' "$tmp/fleet-$f.log" || { echo "fleet $f not ready:"; cat "$tmp/fleet-$f.log"; exit 1; }
done

small_static=$(for i in 0 1 2 3; do printf ' 127.0.0.1:%d' $((SMALL_PORT + i)); done)
large_static=$(for ((i = 0; i < LARGE; i++)); do printf ' 127.0.0.1:%d' $((LARGE_PORT + i)); done)
names=(static dynamic dynamic+pushlb static+least_conn static+pushlb dynamic+least_conn dynamic+pushlb@large)
declare -A port
for i in "${!names[@]}"; do port[${names[i]}]=$((BASE_PORT + i)); done
site() { printf 'http://127.0.0.1:%d {\n\tbind 127.0.0.1\n\treverse_proxy %s\n}\n' "${port[$1]}" "$2"; }
{
	printf '{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\n'
	site static "$small_static"
	site dynamic "{
		dynamic pushlb small {
			nats $nats
		}
	}"
	site dynamic+pushlb "{
		dynamic pushlb small {
			nats $nats
		}
		lb_policy pushlb
	}"
	site static+least_conn "$large_static {
		lb_policy least_conn
	}"
	site static+pushlb "$large_static {
		lb_policy pushlb {
			rule BestAvailable
		}
	}"
	site dynamic+least_conn "{
		dynamic pushlb large {
			nats $nats
		}
		lb_policy least_conn
	}"
	site dynamic+pushlb@large "{
		dynamic pushlb large {
			nats $nats
			rule BestAvailable
		}
		lb_policy pushlb
	}"
} >"$tmp/Caddyfile"

echo "== start caddy $("$tmp/bin/caddy" version | cut -d' ' -f1) with pushlb"
XDG_DATA_HOME=$tmp/caddy XDG_CONFIG_HOME=$tmp/caddy HOME=$tmp/caddy \
	"$tmp/bin/caddy" run --config "$tmp/Caddyfile" --adapter caddyfile >"$tmp/caddy.log" 2>&1 &
pids+=($!)
for n in "${names[@]}"; do waitfor "http://127.0.0.1:${port[$n]}/x"; done

echo "== commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), $(go version | cut -d' ' -f3), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== wrk -t$THREADS -c$CONNS -d$DURATION --latency, $ROUNDS rounds, order rotated each round (warm-up $WARMUP before each); large = $LARGE instances"
: >"$tmp/results"
for ((r = 1; r <= ROUNDS; r++)); do
	for ((k = 0; k < ${#names[@]}; k++)); do
		n=${names[(k + r - 1) % ${#names[@]}]}
		url="http://127.0.0.1:${port[$n]}/x"
		wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "$url" >/dev/null
		wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$url" >"$tmp/wrk.out"
		awk -v name="$n" -v round="$r" '
			function ms(v) {
				if (v ~ /us$/) return v / 1000
				if (v ~ /ms$/) return v + 0
				if (v ~ /s$/) return v * 1000
				return v
			}
			/Requests\/sec:/ { rps = $2 }
			$1 == "50%" { p50 = ms($2) }
			$1 == "99%" { p99 = ms($2) }
			/Non-2xx/ { errs += $NF }
			/Socket errors/ { gsub(/,/, ""); errs += $4 + $6 + $8 + $10 }
			END { printf "%s %d %.0f %.3f %.3f %d\n", name, round, rps, p50, p99, errs }
		' "$tmp/wrk.out" | tee -a "$tmp/results" |
			awk '{ printf "round %d  %-20s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms%s\n", $2, $1, $3, $4, $5, ($6 > 0 ? "  ERRORS " $6 : "") }'
	done
done

echo "== medians over $ROUNDS rounds"
awk -v order="${names[*]}" '
	function med(m, col,    a, c, i, j, t) {
		c = 0
		for (i = 1; i <= NR; i++) if (name[i] == m) a[++c] = val[i, col]
		for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
		return (c % 2) ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2
	}
	function ratio(a, b) { printf "| %s / %s | %.2fx | %.2fx |\n", a, b, R[a] / R[b], P99[a] / P99[b] }
	{ name[NR] = $1; for (k = 3; k <= 5; k++) val[NR, k] = $k + 0; errs[$1] += $6 }
	END {
		n = split(order, names, " ")
		print "| caddy config | req/s | p50 ms | p99 ms |"
		print "|---|---|---|---|"
		for (i = 1; i <= n; i++) {
			m = names[i]; R[m] = med(m, 3); P50[m] = med(m, 4); P99[m] = med(m, 5)
			printf "| %s | %.0f | %.2f | %.2f |%s\n", m, R[m], P50[m], P99[m], (errs[m] ? " errors: " errs[m] : "")
		}
		print ""
		print "| ratio | req/s | p99 |"
		print "|---|---|---|"
		ratio("dynamic", "static")
		ratio("dynamic+pushlb", "static")
		ratio("static+pushlb", "static+least_conn")
		ratio("dynamic+pushlb@large", "static+least_conn")
		ratio("dynamic+pushlb@large", "dynamic+least_conn")
	}' "$tmp/results"
