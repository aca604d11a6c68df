// Package natsconn sets up the NATS connection that pushlb's binaries share:
// the same flags (-nats, -creds, -user, -password, -password-file, -token,
// -token-file, -nkey, -tls-ca, -tls-cert, -tls-key, -nats-timeout,
// -nats-ping-interval), the same environment variables for secrets
// (PUSHLB_NATS_PASSWORD, PUSHLB_NATS_TOKEN, PUSHLB_NATS_NKEY_SEED_FILE), the
// same checks of conflicting options, and the same connection policy.
//
// The policy has two phases:
//
//   - The first connection is retried with backoff for at most
//     [Config.ConnectTimeout] (10 s by default), so a process started just
//     before its NATS server still comes up. Errors that waiting cannot cure
//     (an authorization violation, a TLS certificate the server rejects, an
//     unreadable credentials file) end the wait at once. When the wait runs
//     out, the error names the URL: "cannot reach NATS at
//     nats://127.0.0.1:4222 after 10s: ...".
//   - Once connected, the client reconnects forever (MaxReconnects(-1)) with
//     a short wait between attempts, and logs disconnects, reconnects and
//     asynchronous errors to the zerolog logger it was given. It pings the
//     server every [Config.PingInterval] (5 s by default; nats.go's own
//     default is 2 min) and gives the connection up after [MaxPingsOut]
//     (2) pings unanswered, so that a paused server or a dead link, whose
//     connection looks open, is noticed within 10 to 15 s, before the
//     registry's 30 s leases end. [Config.ForLease] shortens the default
//     for a shorter lease the program was given, and [Config.ValidateLease]
//     refuses an interval given that is too long for it.
//
// Typical use in a command:
//
//	var nc natsconn.Config
//	nc.RegisterFlags(flag.CommandLine)
//	flag.Parse()
//	conn, err := natsconn.Connect(ctx, nc, log)
//
// Secrets stay off the command line with the -...-file flags and the
// environment (see [Config.Resolve] for the precedence: a flag wins over
// the environment). Passwords and tokens embedded in a URL are masked in
// errors and logs; -h never shows a password or token, even one a
// configuration file set.
package natsconn
