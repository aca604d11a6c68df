// Package testutil holds the helpers the project's tests share, so that
// every package waits, picks ports and runs binaries the same way.
//
// The rule they serve: a test never orders events with a sleep and never
// checks an absence after a sleep. It waits for a signal (a log line, a
// closed channel, a counter that proves an event was processed), and every
// wait is bounded.
//
//   - [Eventually] and [EventuallyWithin] poll a condition until it holds,
//     failing the test after a timeout (20 s for Eventually).
//   - [Receive] waits, bounded, for a value or the close of a channel.
//   - [Start] and [StartCmd] run a binary as a [Proc]: its output is kept
//     line by line, [Proc.WaitFor] and [Proc.WaitForRegexp] wait for a line,
//     [Proc.Signal], [Proc.Stop] and [Proc.Kill] end it, [Proc.Wait] returns
//     its exit code. No process outlives its test: test cleanup kills it,
//     and logs its output when the test failed.
//   - [RunWithBinaries] is the TestMain of a package whose tests run
//     binaries: it builds them once with [BuildBinaries], runs the tests,
//     and fails the run on a goroutine left behind.
//   - [Get] sends a GET and returns the status and body, failing the test
//     on an error; [Fetch] returns the error instead, for a condition
//     polled while a server may not answer yet, or with a client of the
//     test's own; [Do] is Fetch for a request of the test's own; [Metric]
//     reads one series of a /metrics page.
//   - [FreePort] and [FreeAddr] return a loopback port free for TCP and UDP.
//   - [SyncBuffer] is a bytes.Buffer safe for concurrent use.
//   - [Percentile] and [GetLoad] serve latency benchmarks.
package testutil
