#!/usr/bin/env bash
# The DNS responder under dnsperf, on one core, against a static zone
# served by the same library, in alternating rounds:
#
#   trivial   a github.com/miekg/dns handler returning prepared records
#             (bench/dnsstatic -mode trivial): the library's floor
#   static    pushlb's dns package over a fixed list (dnsstatic -mode static)
#   pushed    the gateway binary with -dns, answering from the list pushed
#             by 10 instances (bench/cmd/fleet) over NATS (the embedded
#             server of a second gateway, on dnsperf's CPU)
#
# Every answer is "orders.service.pushlb. A": 10 records of 127.0.0.1.
# Each server runs with GOMAXPROCS=1 pinned to CPU 0 (taskset), dnsperf
# to CPU 1. Prints the queries per second of every round (the three back
# to back), their medians, and the median of the rounds' ratios to
# trivial (the goal: pushed costs at most 1.5x trivial, a ratio of at
# least 0.67).
#
#   bash bench/dns.sh
#   ROUNDS=15 DURATION=5 bash bench/dns.sh
#
# Needs dnsperf and dig (Debian: apt-get install dnsperf dnsutils; installed
# when missing) and taskset (util-linux). Ports on 127.0.0.1 from BASE_PORT
# (default 19600: 19600-19607 and the fleet's 19700-19709); every process
# is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")"
bench=$(pwd)
root=$(cd .. && pwd)

ROUNDS=${ROUNDS:-9}
DURATION=${DURATION:-3}
BASE_PORT=${BASE_PORT:-19600}
FLEET_PORT=${FLEET_PORT:-19700}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}

for tool in dnsperf dig; do
  if ! command -v "$tool" >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dnsperf dnsutils >/dev/null
  fi
done

tmp=$(mktemp -d)
pids=()
cleanup() {
  # Last started, first stopped: the fleet withdraws while NATS still runs.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[$i]}" 2>/dev/null || true
    wait "${pids[$i]}" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== build"
(cd "$root" && go build -o "$tmp/" ./cmd/gateway)
(cd "$bench" && go build -o "$tmp/" ./cmd/fleet ./dnsstatic)

p_listen=$BASE_PORT p_admin=$((BASE_PORT + 1)) p_nats=$((BASE_PORT + 2))
p_pushed=$((BASE_PORT + 3)) p_trivial=$((BASE_PORT + 4)) p_static=$((BASE_PORT + 5))
p_host_listen=$((BASE_PORT + 6)) p_host_admin=$((BASE_PORT + 7))

# exec: a background call's $! is then the server itself, which cleanup stops.
one_core() { GOMAXPROCS=1 exec taskset -c "$SERVER_CPU" "$@"; }

# A port in use would make a server fail and the rounds measure whatever
# holds it (a leftover of an earlier run): stop at once instead.
for port in $p_listen $p_admin $p_nats $p_pushed $p_trivial $p_static $p_host_listen $p_host_admin; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "127.0.0.1:$port is in use: stop what holds it, or give BASE_PORT"; exit 1
  fi
done

# NATS runs in a gateway of its own, off the measured core, as a NATS
# cluster would: the measured gateway holds the client and the responder.
taskset -c "$LOAD_CPU" "$tmp/gateway" -listen 127.0.0.1:$p_host_listen -admin 127.0.0.1:$p_host_admin \
  -embedded-nats 127.0.0.1:$p_nats -log-level warn >"$tmp/nats-host.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$p_host_admin/healthz" >/dev/null && break
  sleep 0.1
done
one_core "$tmp/gateway" -listen 127.0.0.1:$p_listen -admin 127.0.0.1:$p_admin \
  -nats nats://127.0.0.1:$p_nats -dns 127.0.0.1:$p_pushed -log-level warn >"$tmp/gateway.log" 2>&1 &
pids+=($!)
one_core "$tmp/dnsstatic" -addr 127.0.0.1:$p_trivial -mode trivial -n 10 >"$tmp/trivial.log" 2>&1 &
pids+=($!)
one_core "$tmp/dnsstatic" -addr 127.0.0.1:$p_static -mode static -n 10 >"$tmp/static.log" 2>&1 &
pids+=($!)

# ten answers from port $1, within 30 s
wait_ten() {
  for _ in $(seq 300); do
    if [ "$(dig @127.0.0.1 -p "$1" +short +tries=1 +time=1 orders.service.pushlb A 2>/dev/null | grep -c 127.0.0.1)" = 10 ]; then return 0; fi
    sleep 0.1
  done
  echo "no 10 answers on port $1"; cat "$tmp"/*.log; exit 1
}
wait_ten $p_trivial
wait_ten $p_static
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$p_admin/healthz" >/dev/null && break
  sleep 0.1
done
"$tmp/fleet" -nats nats://127.0.0.1:$p_nats -service orders -n 10 -port "$FLEET_PORT" >"$tmp/fleet.log" 2>&1 &
pids+=($!)
wait_ten $p_pushed

echo "orders.service.pushlb A" >"$tmp/queries"
declare -A runs ratios
for r in $(seq "$ROUNDS"); do
  declare -A round=()
  for mode in trivial static pushed; do
    port_var=p_$mode
    qps=$(taskset -c "$LOAD_CPU" dnsperf -s 127.0.0.1 -p "${!port_var}" -d "$tmp/queries" -l "$DURATION" -c 1 -q 100 2>&1 |
      awk '/Queries per second/ {print $4}')
    round[$mode]=$qps
    runs[$mode]+="$qps "
  done
  for mode in static pushed; do
    ratios[$mode]+="$(echo "${round[$mode]} / ${round[trivial]}" | bc -l) "
  done
  printf "round %d  trivial %8.0f  static %8.0f  pushed %8.0f qps  pushed/trivial %.2f\n" "$r" \
    "${round[trivial]}" "${round[static]}" "${round[pushed]}" "$(echo "${round[pushed]} / ${round[trivial]}" | bc -l)"
done

# The machine may be shared: the ratio of each round (its three runs back
# to back) is steadier than the ratio of the medians.
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
echo "== medians over $ROUNDS rounds of ${DURATION}s (GOMAXPROCS=1 on CPU $SERVER_CPU, dnsperf on CPU $LOAD_CPU; load average $(cut -d' ' -f1 /proc/loadavg))"
printf "%-8s %10.0f qps\n" trivial "$(echo "${runs[trivial]}" | median)"
for mode in static pushed; do
  printf "%-8s %10.0f qps  %.2fx trivial's queries per second (median of the rounds' ratios): %.2fx its cost\n" "$mode" \
    "$(echo "${runs[$mode]}" | median)" "$(echo "${ratios[$mode]}" | median)" "$(echo "1 / $(echo "${ratios[$mode]}" | median)" | bc -l)"
done
