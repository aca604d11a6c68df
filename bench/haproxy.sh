#!/usr/bin/env bash
# HAProxy fed by cmd/haproxy-sync (docs/haproxy.md): the figures of
# BenchmarkHAProxy and BenchmarkHAProxyRequests (cmd/haproxy-sync's
# bench_test.go), from one test binary, in one run:
#
#   graceful   withdrawal of an instance to the last request HAProxy sent it
#              (p50, p99, max over ITERS), under a steady load of 4 clients
#   crash      its listener and NATS connection closed at once (as SIGKILL
#              does) to HAProxy no longer picking it (its server in
#              maintenance or deleted: p50, p99, max over ITERS)
#   crash-process  the same with real processes: announce (hold mode) and
#              testbackend, both killed with SIGKILL
#   rolling    ITERS rolling restarts of 4 instances under that load: the
#              failed requests (0 expected) and the requests sent
#   requests   HAProxy's req/s over 3 backends written in haproxy.cfg
#              (static) and over the same 3 added by haproxy-sync (pushlb),
#              ROUNDS rounds alternating which goes first: the medians and
#              their ratio (the goal: >= 0.95x)
#
#   bash bench/haproxy.sh
#   ITERS=10 ROUNDS=4 REQS=5000 bash bench/haproxy.sh
#
# Needs haproxy (apt-get install haproxy: Debian's 2.6). NATS runs in the
# test process; every process is stopped by the test binary.
set -euo pipefail
cd "$(dirname "$0")/.."

ITERS=${ITERS:-100}
ROUNDS=${ROUNDS:-8}
REQS=${REQS:-10000}

if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
  echo "haproxy is missing: apt-get install haproxy" >&2; exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/hs.test" ./cmd/haproxy-sync/
cd cmd/haproxy-sync   # where go test runs it: crash-process builds ../announce
echo "== $(haproxy -v | head -1); load $(cut -d' ' -f1-3 /proc/loadavg)"
"$tmp/hs.test" -test.run '^$' -test.bench '^BenchmarkHAProxy$' -test.benchtime "${ITERS}x" > "$tmp/out" ||
  { cat "$tmp/out"; exit 1; }
grep '^Benchmark' "$tmp/out"

for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then order="static pushlb"; else order="pushlb static"; fi
  for name in $order; do
    "$tmp/hs.test" -test.run '^$' -test.bench "^BenchmarkHAProxyRequests/$name\$" -test.benchtime "${REQS}x" |
      awk -v n="$name" -v r="$round" '/^Benchmark/ { for (i = 1; i <= NF; i++) if ($(i+1) == "req/s") print r, n, $i }'
  done
done | tee "$tmp/req"
median() { grep " $1 " "$tmp/req" | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
s=$(median static); p=$(median pushlb)
echo "requests: median req/s static $s, pushlb $p, ratio $(awk -v s="$s" -v p="$p" 'BEGIN {printf "%.2f", p / s}')x"
