package natstest

import "go.uber.org/goleak"

// IgnoreServerGoroutines are the goleak options of a package whose tests
// run in-process nats-servers: the goroutines a server starts (through
// startGoRoutine), its access-time ticker, shared by the servers of the
// process, and a stream's state flusher end shortly after Shutdown
// returns, later on a loaded machine than goleak's retries wait for. They
// are the server's, not the package's: a goroutine of the package's own
// is still reported.
func IgnoreServerGoroutines(more ...goleak.Option) []goleak.Option {
	return append([]goleak.Option{
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
	}, more...)
}
