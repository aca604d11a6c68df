#!/usr/bin/env bash
# Runs the side-by-side pick benchmarks (picks/) once and prints, from that
# one run, a table of ns/op and allocs/op by contender and N, then the
# ratios between pushlb's rules and their peers (grpc-go's round_robin,
# caddy's selection policies): one table for picks from one goroutine
# (serial, GOMAXPROCS=1) and one for picks from two goroutines at once on
# two cores (parallel, GOMAXPROCS=2), where shared cache lines cost.
#
#   bash bench/picks.sh                  # default -benchtime (1s)
#   bash bench/picks.sh -benchtime 200ms # extra flags go to go test
#   bash bench/picks.sh -count 5         # each figure the least of 5 runs
#
# The raw go test output is kept in $PICKS_OUT when set; PUSHLB_COMMIT
# names the commit measured when this is not a git checkout.
set -euo pipefail
cd "$(dirname "$0")"

out=${PICKS_OUT:-$(mktemp)}
[ -n "${PICKS_OUT:-}" ] || trap 'rm -f "$out"' EXIT
echo "# commit ${PUSHLB_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo "?")}, $(go version | cut -d' ' -f3), $(nproc) cores"
echo "# go test -run '^\$' -bench . -benchmem -cpu 1,2 $* ./picks/"
go test -run '^$' -bench . -benchmem -cpu 1,2 "$@" ./picks/ > "$out"
grep -q '^ok' "$out" || { cat "$out"; exit 1; }

awk '
/^BenchmarkPicks\// {
	name = $1
	sub(/^BenchmarkPicks\//, "", name)
	cpu = 1
	if (match(name, /-[0-9]+$/)) { cpu = substr(name, RSTART + 1); name = substr(name, 1, RSTART - 1) }
	mode = name; sub(/.*\//, "", mode)
	sub(/\/[a-z]+$/, "", name)
	n = name; sub(/.*\/N=/, "", n)
	who = name; sub(/\/N=[0-9]+$/, "", who)
	# serial picks at GOMAXPROCS=1, parallel ones at 2: the two tables.
	if (!((mode == "serial" && cpu == 1) || (mode == "parallel" && cpu == 2))) next
	g = mode
	# With -count N, the least of the N runs: other load only adds.
	if ((g, who, n) in ns && ns[g, who, n] <= $3 + 0) next
	ns[g, who, n] = $3 + 0
	for (i = 4; i <= NF; i++) if ($(i+1) == "allocs/op") al[g, who, n] = $i
	if (!(who in seen)) { seen[who] = 1; order[++nw] = who }
	if (!(n in seenN)) { seenN[n] = 1; sizes[++nn] = n }
}
function fmtn(x) { return x >= 100 ? sprintf("%.0f", x) : sprintf("%.1f", x) }
function ratio(g, a, b, n) { return ((g, a, n) in ns && (g, b, n) in ns && ns[g, b, n] > 0) ? sprintf("%.2fx", ns[g, a, n] / ns[g, b, n]) : "-" }
function table(g, title,   i, j, k, r, hdr, sep, rhdr, line, ab) {
	hdr = "| contender |"; sep = "|---|"
	for (j = 1; j <= nn; j++) { hdr = hdr " N=" sizes[j] " |"; sep = sep "---|" }
	print "ns/op (allocs/op) of one pick, " title ":"
	print ""
	print hdr; print sep
	for (i = 1; i <= nw; i++) {
		line = "| " order[i] " |"
		for (j = 1; j <= nn; j++) {
			k = g SUBSEP order[i] SUBSEP sizes[j]
			line = line " " ((k in ns) ? fmtn(ns[k]) " (" al[k] ")" : "-") " |"
		}
		print line
	}
	print ""
	print "Ratios, " title " (ns/op over ns/op, same run):"
	print ""
	rhdr = hdr; sub(/contender/, "ratio", rhdr)
	print rhdr; print sep
	for (r = 1; r <= npairs; r++) {
		split(pairs[r], ab, ":")
		line = "| " ab[1] " / " ab[2] " |"
		for (j = 1; j <= nn; j++) line = line " " ratio(g, ab[1], ab[2], sizes[j]) " |"
		print line
	}
	print ""
}
END {
	if (nw == 0) { print "no benchmark results"; exit 1 }
	npairs = split("pushlb/RoundRobin_1zone:grpc/round_robin;" \
		"pushlb/RoundRobin_3zones:grpc/round_robin;" \
		"pushlb/ZoneAvoidance_3zones:grpc/round_robin;" \
		"pushlb/RoundRobin_1zone:caddy/RoundRobin;" \
		"caddy/Random:pushlb/Random_3zones;" \
		"caddy/LeastConn:pushlb/BestAvailable_3zones;" \
		"caddy/LeastConn:pushlb/LeastRequest_3zones;" \
		"caddy/IPHash:pushlb/Maglev_3zones_keyed", pairs, ";")
	table("serial", "one goroutine, GOMAXPROCS=1")
	table("parallel", "two goroutines, GOMAXPROCS=2")
}' "$out"
