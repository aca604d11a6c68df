#!/usr/bin/env bash
# Runs nginx (worker_processes auto, upstream keepalive), caddy
# (reverse_proxy, built from its Go module in this bench module), the
# pushlb gateway (embedded NATS, the backend registered by announce) and
# fastlb (cmd/fastlb: pushlb's balancer behind fasthttp instead of net/http,
# a measurement of another HTTP engine, static upstream list) in front of
# the same Go backend (internal/testkit/testbackend), and loads each with wrk in
# alternating rounds. Prints req/s, p50 and p99 of every round, the CPU
# time each proxy's processes used per request (user+sys from /proc, the
# figure the machine's other load disturbs least), their medians, and the
# ratios to nginx.
#
#   bash bench/gateway.sh
#   ROUNDS=3 DURATION=10s CONNS=32 THREADS=1 bash bench/gateway.sh
#
# PUSHLB_SRC=DIR builds the gateway, announce, the backend and fastlb's
# balancer from another checkout of pushlb (for example `git archive HEAD |
# tar -x -C DIR`, to measure a commit while the work tree has changes;
# PUSHLB_COMMIT then names the commit in the output); default: this one.
#
# BASE_SRC=DIR adds a fifth proxy, "base": the gateway built from that
# checkout (its own embedded NATS, the same backend announced to it by an
# announce in hold mode), loaded in the same rounds, so that a change is
# measured against its base commit in one run (BASE_COMMIT names it).
#
# GATEWAY_ENV="GOGC=400" sets environment variables for the pushlb gateway
# alone (a runtime setting measured against the other proxies).
#
# Installs wrk and nginx with apt-get when they are missing (Debian). Ports,
# all on 127.0.0.1, can be moved with the variables below; every process the
# script starts is stopped on exit, and its files live in a mktemp dir.
set -euo pipefail
cd "$(dirname "$0")"
bench=$(pwd)
root=$(cd "${PUSHLB_SRC:-..}" && pwd)

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
CONNS=${CONNS:-32}
THREADS=${THREADS:-1}
BACKEND_PORT=${BACKEND_PORT:-19101}
NGINX_PORT=${NGINX_PORT:-19102}
CADDY_PORT=${CADDY_PORT:-19103}
GW_PORT=${GW_PORT:-19104}
GW_ADMIN_PORT=${GW_ADMIN_PORT:-19105}
NATS_PORT=${NATS_PORT:-19106}
FASTLB_PORT=${FASTLB_PORT:-19107}
BASE_GW_PORT=${BASE_GW_PORT:-19108}
BASE_ADMIN_PORT=${BASE_ADMIN_PORT:-19109}
BASE_NATS_PORT=${BASE_NATS_PORT:-19110}
SERVICE=bench

missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
if [ ${#missing[@]} -gt 0 ]; then
	echo "== apt-get install ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

for port in $BACKEND_PORT $NGINX_PORT $CADDY_PORT $GW_PORT $GW_ADMIN_PORT $NATS_PORT $FASTLB_PORT \
	${BASE_SRC:+$BASE_GW_PORT $BASE_ADMIN_PORT $BASE_NATS_PORT}; do
	if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
		echo "port $port on 127.0.0.1 is in use: move it (see the variables at the top of $0)" >&2
		exit 1
	fi
done

. ./processes.sh # the working directory is bench/ (cd above)

echo "== build (into $tmp/bin)"
mkdir -p "$tmp/bin"
(cd "$root" && go build -o "$tmp/bin/" ./cmd/gateway ./cmd/announce ./internal/testkit/testbackend)
if [ -n "${BASE_SRC:-}" ]; then
	mkdir -p "$tmp/base"
	(cd "$BASE_SRC" && go build -o "$tmp/base/" ./cmd/gateway ./cmd/announce)
fi
go build -o "$tmp/bin/caddy" ./cmd/caddy
# fastlb links the balancer of the same checkout as the gateway: a copy of
# this module's go.mod with its replace pointed at $root.
cp go.mod go.sum "$tmp/"
go mod edit -modfile="$tmp/go.mod" -replace "github.com/pushlb/pushlb=$root"
go build -modfile="$tmp/go.mod" -o "$tmp/bin/fastlb" ./cmd/fastlb

# waitfor URL WANT: until URL answers 200 with WANT in the body (10 s).
waitfor() {
	for _ in $(seq 100); do
		if body=$(curl -fsS -m 1 "$1" 2>/dev/null) && [[ $body == *"$2"* ]]; then return 0; fi
		sleep 0.1
	done
	echo "no answer from $1 with \"$2\"; logs in $tmp:" >&2
	tail -n 20 "$tmp"/*.log >&2 || true
	return 1
}

echo "== start the pushlb gateway (embedded NATS on :$NATS_PORT) and the backend under announce"
env ${GATEWAY_ENV:-} "$tmp/bin/gateway" -listen "127.0.0.1:$GW_PORT" -admin "127.0.0.1:$GW_ADMIN_PORT" \
	-embedded-nats "127.0.0.1:$NATS_PORT" -data-dir "$tmp/gateway-data" -log-level warn \
	>"$tmp/gateway.log" 2>&1 &
pids+=($!)
declare -A proc=([pushlb]=$!)
waitfor "http://127.0.0.1:$GW_ADMIN_PORT/readyz" ""
"$tmp/bin/announce" -nats "nats://127.0.0.1:$NATS_PORT" -service "$SERVICE" -addr "127.0.0.1:$BACKEND_PORT" -- \
	"$tmp/bin/testbackend" -addr "127.0.0.1:$BACKEND_PORT" -name "$SERVICE" >"$tmp/backend.log" 2>&1 &
pids+=($!)
waitfor "http://127.0.0.1:$BACKEND_PORT/x" "$SERVICE"

if [ -n "${BASE_SRC:-}" ]; then
	echo "== start the base gateway (embedded NATS on :$BASE_NATS_PORT), the backend announced to it"
	"$tmp/base/gateway" -listen "127.0.0.1:$BASE_GW_PORT" -admin "127.0.0.1:$BASE_ADMIN_PORT" \
		-embedded-nats "127.0.0.1:$BASE_NATS_PORT" -data-dir "$tmp/base-data" -log-level warn \
		>"$tmp/base-gateway.log" 2>&1 &
	pids+=($!)
	proc[base]=$!
	waitfor "http://127.0.0.1:$BASE_ADMIN_PORT/readyz" ""
	"$tmp/base/announce" -nats "nats://127.0.0.1:$BASE_NATS_PORT" -service "$SERVICE" -addr "127.0.0.1:$BACKEND_PORT" \
		>"$tmp/base-announce.log" 2>&1 &
	pids+=($!)
fi

echo "== start nginx $("$nginx_bin" -v 2>&1 | sed 's/.*\///')"
mkdir -p "$tmp/nginx"
cat >"$tmp/nginx.conf" <<EOF
worker_processes auto;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx.log warn;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path $tmp/nginx/body;
	proxy_temp_path $tmp/nginx/proxy;
	fastcgi_temp_path $tmp/nginx/fastcgi;
	uwsgi_temp_path $tmp/nginx/uwsgi;
	scgi_temp_path $tmp/nginx/scgi;
	upstream backend {
		server 127.0.0.1:$BACKEND_PORT;
		keepalive 64;
	}
	server {
		listen 127.0.0.1:$NGINX_PORT;
		location / {
			proxy_pass http://backend;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
		}
	}
}
EOF
"$nginx_bin" -e "$tmp/nginx.log" -p "$tmp/nginx" -c "$tmp/nginx.conf" -g 'daemon off;' >>"$tmp/nginx.log" 2>&1 &
pids+=($!)
proc[nginx]=$!

echo "== start caddy $("$tmp/bin/caddy" version | cut -d' ' -f1)"
cat >"$tmp/Caddyfile" <<EOF
{
	admin off
	auto_https off
	persist_config off
}
http://127.0.0.1:$CADDY_PORT {
	reverse_proxy 127.0.0.1:$BACKEND_PORT
}
EOF
XDG_DATA_HOME=$tmp/caddy XDG_CONFIG_HOME=$tmp/caddy HOME=$tmp/caddy \
	"$tmp/bin/caddy" run --config "$tmp/Caddyfile" --adapter caddyfile >"$tmp/caddy.log" 2>&1 &
pids+=($!)
proc[caddy]=$!

echo "== start fastlb (fasthttp $(go list -m -f '{{.Version}}' github.com/valyala/fasthttp), static upstream)"
"$tmp/bin/fastlb" -listen "127.0.0.1:$FASTLB_PORT" -upstream "$SERVICE=127.0.0.1:$BACKEND_PORT" >"$tmp/fastlb.log" 2>&1 &
pids+=($!)
proc[fastlb]=$!

# cputicks PID: user+sys clock ticks of PID and its children (nginx's
# workers), from /proc.
cputicks() {
	local p t=0
	for p in "$1" $(pgrep -P "$1" || true); do
		t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0)))
	done
	echo "$t"
}
hz=$(getconf CLK_TCK)

declare -A url=(
	[nginx]="http://127.0.0.1:$NGINX_PORT/$SERVICE/x"
	[caddy]="http://127.0.0.1:$CADDY_PORT/$SERVICE/x"
	[pushlb]="http://127.0.0.1:$GW_PORT/$SERVICE/x"
	[fastlb]="http://127.0.0.1:$FASTLB_PORT/$SERVICE/x"
)
names=(nginx caddy pushlb fastlb)
if [ -n "${BASE_SRC:-}" ]; then
	url[base]="http://127.0.0.1:$BASE_GW_PORT/$SERVICE/x"
	names+=(base)
fi
for n in "${names[@]}"; do waitfor "${url[$n]}" "$SERVICE"; done

commit=${PUSHLB_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')}
if [ -n "${BASE_SRC:-}" ]; then
	commit="$commit (base: ${BASE_COMMIT:-$(git -C "$BASE_SRC" rev-parse --short HEAD 2>/dev/null || echo "$BASE_SRC")})"
fi
echo "== commit $commit, $(go version | cut -d' ' -f3), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== wrk -t$THREADS -c$CONNS -d$DURATION --latency, $ROUNDS rounds, order rotated each round (warm-up $WARMUP before each)"
: >"$tmp/results"
for ((r = 1; r <= ROUNDS; r++)); do
	for ((k = 0; k < ${#names[@]}; k++)); do
		n=${names[(k + r - 1) % ${#names[@]}]}
		wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" "${url[$n]}" >/dev/null
		t0=$(cputicks "${proc[$n]}")
		wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "${url[$n]}" >"$tmp/wrk.out"
		t1=$(cputicks "${proc[$n]}")
		# req/s, p50 and p99 in ms, errors (non-2xx and socket errors),
		# CPU µs per request.
		awk -v name="$n" -v round="$r" -v ticks=$((t1 - t0)) -v hz="$hz" '
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
			/ requests in / { reqs = $1 }
			END { printf "%s %d %.0f %.3f %.3f %d %.1f\n", name, round, rps, p50, p99, errs, (reqs ? ticks * 1e6 / hz / reqs : 0) }
		' "$tmp/wrk.out" | tee -a "$tmp/results" |
			awk '{ printf "round %d  %-6s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  cpu %5.1f us/req%s\n", $2, $1, $3, $4, $5, $7, ($6 > 0 ? "  ERRORS " $6 : "") }'
	done
done

echo "== medians over $ROUNDS rounds"
awk -v order="${names[*]}" '
	# med: the median of the column col of the rounds of m (any awk).
	function med(m, col,    a, c, i, j, t) {
		c = 0
		for (i = 1; i <= NR; i++) if (name[i] == m) a[++c] = val[i, col]
		for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
		return (c % 2) ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2
	}
	{ name[NR] = $1; for (k = 3; k <= 7; k++) val[NR, k] = $k + 0; errs[$1] += $6 }
	END {
		n = split(order, names, " ")
		for (i = 1; i <= n; i++) {
			m = names[i]; R[m] = med(m, 3); P50[m] = med(m, 4); P99[m] = med(m, 5); C[m] = med(m, 7)
		}
		print "| proxy | req/s | p50 ms | p99 ms | CPU µs/req | req/s vs nginx | p50 vs nginx | p99 vs nginx | CPU/req vs nginx |"
		print "|---|---|---|---|---|---|---|---|---|"
		for (i = 1; i <= n; i++) {
			m = names[i]
			printf "| %s | %.0f | %.2f | %.2f | %.1f | %.2fx | %.2fx | %.2fx | %.2fx |%s\n", m, R[m], P50[m], P99[m], C[m],
				R[m] / R["nginx"], P50[m] / P50["nginx"], P99[m] / P99["nginx"], C[m] / C["nginx"], (errs[m] ? " errors: " errs[m] : "")
		}
		printf "pushlb / caddy req/s: %.2fx\n", R["pushlb"] / R["caddy"]
		printf "fastlb / pushlb req/s: %.2fx\n", R["fastlb"] / R["pushlb"]
		if ("base" in R) printf "pushlb / base req/s: %.2fx, p99 %.2fx, CPU per request %.2fx\n", R["pushlb"] / R["base"], P99["pushlb"] / P99["base"], C["pushlb"] / C["base"]
	}' "$tmp/results"
