// Package regionbench holds the multi-region figures of issue 39 as Go
// benchmarks over real processes: a nats-server process per region, each
// its own JetStream domain, the first region the hub and every other one a
// leaf node of it through a link the benchmark can cut
// (internal/testkit/natsproc, Regions), and real gateway and announce
// processes, built once per run from cmd/gateway and cmd/announce.
//
//   - BenchmarkRegionChange/regions=2 and /regions=3: a record change
//     (a Register or a Deregister through serverlist) in region a, and
//     with three regions also in leaf region c (through the hub), until a
//     client in region b (pushlb.Client, Region "b", FollowAll, its
//     ListObserver) has it in its list, while a gateway process in b
//     (-region b -remote-region a [-remote-region c]) replicates; beside
//     it, interleaved, the raw NATS hop over the same link (a plain
//     publish in the source region to a subscriber in b) and the ratio of
//     the two. The goal is change p99 ≤ 2x the raw hop's p99.
//   - BenchmarkRegionFailover: a gateway in region a (-region a
//     -remote-region b) under a steady load with the gateway's retries;
//     a's last instance withdrawn (its announce SIGTERMed: offline,
//     deregistered), then crashed (announce SIGKILLed, backend closed;
//     the servers run pushlb's accounts, so the crash is found by a
//     client-disconnect advisory), until the first request that b's
//     instance serves. Goals: ≤ 100 ms, 0 failed requests.
//   - BenchmarkRegionLinkCut/regions=2 and /regions=3: each region with
//     instances of its own and the others' copies, a gateway in each
//     under load; b's leaf link cut for 30 s, during which region a gains
//     an instance and loses one (with three regions, c, still linked,
//     follows them meanwhile); then healed. Goals: 0 failed requests;
//     b's list of a's instances right ≤ 1 s after the link is back.
//
// Every metric is reported with b.ReportMetric; its name says its unit.
// ns/op is the whole run (processes started, measured, stopped) and
// means nothing.
//
// The issue asks for the best of three runs: run
//
//	go test -run='^$' -bench=Region -benchtime=1x -count 3 -timeout 30m ./internal/testkit/regionbench/
//
// and take, per figure, the best of the three lines (each run starts its
// own servers, gateways and instances; the binaries are built once).
// With -short every part runs once, minimally and without the 30 s cut
// (the link is cut only until both sides mark each other stale), so that
// CI's one pass over every benchmark stays short.
package regionbench
