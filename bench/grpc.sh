#!/usr/bin/env bash
# The gRPC integration's figures, side by side in one run (docs/perf.md):
# a pick and its Done through grpc-go's round_robin and through the pushlb
# balancer (N = 3 and 10,000, 1 and 3 zones, -cpu 1,2), RPCs per second
# over the same three servers (static round_robin, the pushlb resolver with
# round_robin, the pushlb resolver and balancer), the withdrawal to the last
# RPC under load, and the xDS control plane's offline figures. The
# benchmarks live in the nested modules grpc/ and xds/, which depend on
# grpc-go; the main module does not.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${COUNT:-1}
echo "== grpc/: picks (the 10,000-endpoint balancers take seconds to build)"
(cd grpc && go test -run '^$' -bench 'BenchmarkPick' -benchtime=${PICKS:-2000000x} -cpu 1,2 -count "$count" .)
echo "== grpc/: RPCs per second, withdrawal to the last RPC"
(cd grpc && go test -run '^$' -bench 'BenchmarkRPCs' -benchtime=${RPCTIME:-3s} -count "$count" .)
(cd grpc && go test -run '^$' -bench 'BenchmarkWithdrawalToLastRPC' -benchtime=${WITHDRAWALS:-100x} -count "$count" .)
echo "== xds/: offline to the EDS response and to the xDS client's last RPC"
(cd xds && go test -run '^$' -bench 'BenchmarkOfflineTo' -benchtime=${OFFLINES:-200x} -count "$count" .)
