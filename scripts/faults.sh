#!/usr/bin/env bash
# faults.sh is the fault suite's long form (docs/reliability.md, "Faults,
# measured"): the fault tests of cmd/gateway, which CI runs once each, run
# ROUNDS times over, the crash-restart test with 20 cycles a round, and
# each run's figures (the lines the tests log: requests failed, time until
# the lists are right again, moves, restarts) gathered in one summary.
#
#   scripts/faults.sh [ROUNDS]
#
# Real gateway, announce and nats-server processes (in-process servers
# where a test says so); it stops at the first failing round and leaves
# its output in $LOG_DIR.
#
# Environment:
#   ROUNDS      rounds (default 5; the first argument wins)
#   CRASH_RUNS  crash-restart cycles a round (default 20)
#   RACE=1      build the tests with -race (slower; CI's own form)
#   LOG_DIR     where each round's output goes (default a new temporary dir)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
ROUNDS=${1:-${ROUNDS:-5}}
CRASH_RUNS=${CRASH_RUNS:-20}
LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/pushlb-faults-XXXXXX)}
mkdir -p "$LOG_DIR"

# The fault tests: one per fault of the suite, and the crash-restart and
# partition ones.
tests='^(TestCluster(LosesEveryStore|RegistryLosesQuorum|LeaderKilledDuringChurn|NodePaused|NodeStopped|Partition.*)|TestPublisherLinkCut|TestGateway(RestartedDuringChurn|Node.*)|TestCrashRestart.*)$'
race=()
if [ "${RACE:-}" = 1 ]; then race=(-race); fi

summary="$LOG_DIR/summary.txt"
: > "$summary"
for round in $(seq 1 "$ROUNDS"); do
  log="$LOG_DIR/round-$round.log"
  echo "== round $round of $ROUNDS ($log)"
  if ! PUSHLB_CRASH_RUNS=$CRASH_RUNS go test "${race[@]}" -count=1 -v -timeout 60m -run "$tests" ./cmd/gateway/ > "$log" 2>&1; then
    grep -E -- '^(--- FAIL|FAIL|panic)|_test\.go:[0-9]+:' "$log" | tail -40
    echo "round $round failed: $log"
    exit 1
  fi
  # A figure line is a test's log line (file:line: text), its name before it.
  awk -v round="$round" '
    /^=== RUN/ { name = $3 }
    /^    [a-z_]+_test\.go:[0-9]+: / { sub(/^    [a-z_]+_test\.go:[0-9]+: /, ""); print "round " round " " name ": " $0 }
  ' "$log" | grep -E 'right|load:|over [0-9]+|moved|re-announced|refused' >> "$summary" || true
  grep -E '^--- (PASS|SKIP)' "$log" | sed "s/^/round $round /" >> "$summary"
done
echo "== summary ($summary)"
cat "$summary"
