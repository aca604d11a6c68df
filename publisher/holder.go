package publisher

import (
	"context"
	"net"
	"strings"
	"time"

	"github.com/pushlb/pushlb/serverlist"
)

// The probe of a claimed ID's holder (serverlist.ClaimOptions.HolderAnswers)
// is the gateways' probe after a disconnect advisory (package subscriber):
// a connect to the holder's gossip node, or its service address, then a few
// more that confirm it.
const (
	// holderProbeTimeout bounds one connect of the probe.
	holderProbeTimeout = 250 * time.Millisecond
)

// holderProbeConfirm are the delays, after a first connect that succeeded,
// of the connects that confirm the holder alive: the address may belong to
// a command the holder supervised, which the kernel signals when the holder
// dies and which may still accept for a few milliseconds.
var holderProbeConfirm = []time.Duration{20 * time.Millisecond, 80 * time.Millisecond, 200 * time.Millisecond}

// holderProbeTarget is the address the probe of held's holder connects to:
// its gossip node when its record names one (it runs in the process that
// holds the ID), else its service address.
func holderProbeTarget(held serverlist.Instance) (addr, kind string) {
	if held.GossipAddr != "" {
		return held.GossipAddr, "gossip"
	}
	return held.Addr(), "service"
}

// ownAddress reports whether addr is one of self's own addresses, its
// service address or its gossip node's: an answer there may be the
// claimant's own (a restart on the same host and port, whose command is
// already up), which tells nothing about the holder.
func ownAddress(addr string, self serverlist.Instance) bool {
	return sameAddr(addr, self.Addr()) || self.GossipAddr != "" && sameAddr(addr, self.GossipAddr)
}

// sameAddr reports whether the host:port addresses a and b are the same:
// equal ports and equal hosts, IPs compared as IPs and names without
// regard to case.
func sameAddr(a, b string) bool {
	ah, ap, aerr := net.SplitHostPort(a)
	bh, bp, berr := net.SplitHostPort(b)
	if aerr != nil || berr != nil {
		return a == b
	}
	if ap != bp {
		return false
	}
	if aip, bip := net.ParseIP(ah), net.ParseIP(bh); aip != nil && bip != nil {
		return aip.Equal(bip)
	}
	return strings.EqualFold(ah, bh)
}

// holderAnswers returns the claim's probe of the holder of the ID self
// claims (serverlist.ClaimOptions.HolderAnswers): true when the holder's
// probe target accepts connections, now and over holderProbeConfirm. A
// target that is self's own address is not probed (false: the claim then
// watches the record for a renewal), nor does a probe that fails prove the
// holder dead.
func (p *Publisher) holderAnswers(self serverlist.Instance) func(ctx context.Context, held serverlist.Instance) bool {
	return func(ctx context.Context, held serverlist.Instance) bool {
		addr, kind := holderProbeTarget(held)
		if ownAddress(addr, self) {
			p.log.Debug().Str("service", self.Service).Str("id", self.InstanceID).Str("probe", kind).Str("addr", addr).
				Msg("not probing the instance ID's holder: its address is this process's own; watching its record instead")
			return false
		}
		began := time.Now()
		err := probe(ctx, addr)
		p.log.Debug().Str("service", self.Service).Str("id", self.InstanceID).Str("probe", kind).Str("addr", addr).
			Bool("answers", err == nil).AnErr("probe_error", err).Dur("probe_took", time.Since(began)).
			Msg("probed the instance ID's holder")
		return err == nil
	}
}

// probe connects to addr, then again after each of holderProbeConfirm's
// delays. It returns the first failure: nil means addr answered every time.
func probe(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: holderProbeTimeout}
	var waited time.Duration
	for i := 0; ; i++ {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		c.Close()
		if i == len(holderProbeConfirm) {
			return nil
		}
		t := time.NewTimer(holderProbeConfirm[i] - waited)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		waited = holderProbeConfirm[i]
	}
}
