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

// ConfirmEvery and ConfirmFor: after a first connect that succeeded, the
// address is connected to again every ConfirmEvery for ConfirmFor. Dense,
// so that a process restarted at once on the same address (systemd's
// Restart=always, a crash loop) is not taken for the one that died: the
// new process can only bind the port once the old one's listener is gone,
// and a connect in between is refused. 40 connects over 200 ms.
const (
	ConfirmEvery = 5 * time.Millisecond
	ConfirmFor   = 200 * time.Millisecond
)

// Answers connects to addr, each connect bounded by timeout, then again
// every ConfirmEvery for ConfirmFor while it answers. It returns nil when
// every connect answered, else the first failure, or ctx's error when ctx
// ended.
func Answers(ctx context.Context, addr string, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	deadline := time.Now().Add(ConfirmFor)
	t := time.NewTicker(ConfirmEvery)
	defer t.Stop()
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		c.Close()
		if !time.Now().Before(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
