// Package natstest runs a real, in-process nats-server with JetStream for
// tests, so that no test in pushlb has to mock NATS.
//
// A [Server] listens on 127.0.0.1 on a random port and stores JetStream data
// in a temporary directory owned by the test. [Server.Restart] brings the
// server back on the same port with the same store directory, which lets
// tests exercise client reconnects and check that registry data survives a
// restart. A [Link] is a TCP proxy in front of a server whose connections
// can be frozen: a dead link or a paused server as a client sees it, a
// connection that stays open while nothing gets through. Everything
// started here is stopped by the test's cleanup.
//
//	srv := natstest.Start(t)
//	nc := srv.Connect(t)
//	js, _ := jetstream.New(nc)
//
// The package works from any package's tests: it takes a [testing.TB].
package natstest
