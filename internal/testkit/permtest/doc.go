// Package permtest holds the tests of pushlb's permissions model
// (docs/security.md) against a real nats-server that loads the
// configurations shipped in examples/nats-server: an announcer can only
// announce its own service, a gateway can only read, the Kubernetes
// bridge writes only the services it bridges (and no announcer writes
// them), nobody but the operator can change the registry bucket, and the
// whole push path works under those grants, with the credentials kept off
// the command line.
//
// It has no code of its own: only tests.
package permtest
