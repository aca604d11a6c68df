#!/usr/bin/env bash
# stress-tests.sh runs packages' tests over and over on a busy machine, the
# way a loaded CI machine runs them, to find tests that depend on timing.
#
#   scripts/stress-tests.sh [PKG...]
#
# For each package (default: every package of every module of the
# checkout, e2e/ and the nested modules included) it runs
#
#   go test -race -count=$COUNT -cpu $CPUS PKG
#
# while $LOAD CPU-bound processes (`yes > /dev/null`) run beside it, and
# stops at the first failure, leaving the output in $LOG_DIR. PKG is a
# package pattern relative to the checkout's root, such as ./subscriber or
# ./e2e/... (a nested module's packages run from inside that module).
#
# Environment:
#   COUNT    runs of each test per -cpu value (default 10)
#   CPUS     the -cpu list (default "1,2": GOMAXPROCS 1, then 2)
#   LOAD     CPU-bound processes beside the tests (default 2)
#   TIMEOUT  go test -timeout (default 60m)
#   LOG_DIR  where each package's output goes (default a new temporary dir)
#   KEEP_GOING=1  go on after a failing package, and exit 1 at the end
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
COUNT=${COUNT:-10}
CPUS=${CPUS:-1,2}
LOAD=${LOAD:-2}
TIMEOUT=${TIMEOUT:-60m}
LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/pushlb-stress-XXXXXX)}
mkdir -p "$LOG_DIR"

# modules: the directories holding a go.mod, the root first.
modules() { git ls-files -- 'go.mod' '*/go.mod' | xargs -n1 dirname | sort; }

# packages lists every package of every module as ./dir patterns.
packages() {
  local m
  for m in $(modules); do
    (cd "$m" && go list -f '{{.Dir}}' ./...) | sed "s|^$root|.|; s|^\.$|./|"
  done
}

# module_of prints the module directory that holds package dir $1.
module_of() {
  local dir=${1#./} best=. m
  for m in $(modules); do
    [ "$m" = . ] && continue
    case "$dir/" in "$m"/*) best=$m ;; esac
  done
  echo "$best"
}

pkgs=("$@")
[ ${#pkgs[@]} -eq 0 ] && mapfile -t pkgs < <(packages)

loaders=()
stop_load() { for p in "${loaders[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop_load EXIT
for _ in $(seq "$LOAD"); do yes > /dev/null & loaders+=($!); done

echo "stress: ${#pkgs[@]} package(s), -count=$COUNT -cpu $CPUS, $LOAD CPU-bound process(es) beside; logs in $LOG_DIR"
failed=()
for pkg in "${pkgs[@]}"; do
  mod=$(module_of "$pkg")
  rel=${pkg#./}; rel=${rel#"$mod"}; rel=./${rel#/}
  [ "$rel" = "./" ] && rel=.
  log="$LOG_DIR/$(echo "${pkg#./}" | tr '/.' '__' | sed 's/^_*//; s/^$/root/').log"
  start=$(date +%s)
  if (cd "$mod" && go test -race -count="$COUNT" -cpu "$CPUS" -timeout "$TIMEOUT" "$rel") > "$log" 2>&1; then
    echo "ok    $pkg  $(( $(date +%s) - start ))s"
  else
    echo "FAIL  $pkg  $(( $(date +%s) - start ))s  (log: $log)"
    grep -E '^(--- FAIL|panic:|FAIL|\s+\S+_test\.go:[0-9]+:)' "$log" | head -20
    failed+=("$pkg")
    [ "${KEEP_GOING:-0}" = 1 ] || exit 1
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "stress: failed: ${failed[*]}"; exit 1
fi
echo "stress: all passed"
