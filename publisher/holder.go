package publisher

import (
	"context"
	"net"
	"strings"
	"time"

	"github.com/pushlb/pushlb/internal/base/probe"
	"github.com/pushlb/pushlb/serverlist"
)

// The probe of a claimed ID's holder (serverlist.ClaimOptions.HolderAnswers)
// is the gateways' probe after a disconnect advisory (package probe) of the
// address the holder's record names (serverlist.Instance.ProbeTarget).

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
// probe target accepts connections, now and over probe.ConfirmFor. A
// target that is self's own address is not probed (false: the claim then
// watches the record for a renewal), nor does a probe that fails prove the
// holder dead.
func (p *Publisher) holderAnswers(self serverlist.Instance) func(ctx context.Context, held serverlist.Instance) bool {
	return func(ctx context.Context, held serverlist.Instance) bool {
		addr, kind := held.ProbeTarget()
		if ownAddress(addr, self) {
			p.log.Debug().Str("service", self.Service).Str("id", self.InstanceID).Str("probe", kind).Str("addr", addr).
				Msg("not probing the instance ID's holder: its address is this process's own; watching its record instead")
			return false
		}
		began := time.Now()
		err := probe.Answers(ctx, addr, probe.DefaultTimeout)
		p.log.Debug().Str("service", self.Service).Str("id", self.InstanceID).Str("probe", kind).Str("addr", addr).
			Bool("answers", err == nil).AnErr("probe_error", err).Dur("probe_took", time.Since(began)).
			Msg("probed the instance ID's holder")
		return err == nil
	}
}
