# Sourced by the benchmark scripts that start processes (gateway.sh,
# caddy.sh): $tmp is a scratch directory, and every pid appended to
# "pids" is stopped on exit, newest first (a load generator, then the
# proxies, then announce, which withdraws its backend and stops it, then
# the gateway and its NATS server), then waited for; $tmp goes last.
tmp=$(mktemp -d)
pids=()
cleanup() {
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
