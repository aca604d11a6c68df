// Package probe tells whether a process answers at an address: the probe
// of an instance that the gateways run after its connection's disconnect
// advisory (package subscriber), and that a claimant runs on the holder of
// the ID it claims (package publisher). Both connect to the address the
// instance's record names (serverlist.Instance.ProbeTarget), then again a
// few times to confirm: the address may belong to a command the instance's
// process supervised, which the kernel signals when that process dies and
// which may still accept for a few milliseconds.
package probe

import (
	"context"
	"net"
	"time"
)

// DefaultTimeout bounds one connect unless the caller says otherwise.
const DefaultTimeout = 250 * time.Millisecond

// Confirm are the delays, after a first connect that succeeded, of the
// connects that confirm the address answers.
var Confirm = []time.Duration{20 * time.Millisecond, 80 * time.Millisecond, 200 * time.Millisecond}

// Answers connects to addr, each connect bounded by timeout, then again
// after each of Confirm's delays while it answers. It returns nil when
// every connect answered, else the first failure, or ctx's error when ctx
// ended.
func Answers(ctx context.Context, addr string, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	var waited time.Duration
	for i := 0; ; i++ {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		c.Close()
		if i == len(Confirm) {
			return nil
		}
		t := time.NewTimer(Confirm[i] - waited)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		waited = Confirm[i]
	}
}
