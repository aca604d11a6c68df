package subscriber

import (
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/serverlist"
)

// GossipHandler returns the handler of a gateway's gossip node: an instance
// node declared dead, or leaving, is taken offline for its incarnation
// (GossipGone); one that comes back (a refuted suspicion) is restored
// (GossipAlive). Only the node that the instance's registry record names
// speaks for it: reports from any other are dropped and counted
// (Stats.GossipIgnored). Pass it to gossip.New.
func (s *Subscriber) GossipHandler() gossip.Handler {
	g := &s.guard
	return gossip.HandlerFuncs{
		Alive: func(m gossip.Member) {
			if g.accept(m, "alive") {
				s.GossipAlive(m.Meta.Service, m.Meta.InstanceID, m.Meta.Incarnation)
			}
		},
		Gone: func(m gossip.Member, reason gossip.Reason) {
			if m.Meta.Role != gossip.RoleInstance {
				return
			}
			s.log.Info().Str("node", m.Name).Str("addr", m.Addr).Str("reason", string(reason)).Msg("gossip: instance gone")
			if g.accept(m, string(reason)) {
				s.GossipGone(m.Meta.Service, m.Meta.InstanceID, m.Meta.Incarnation)
			}
		},
	}
}

// gossipGuard decides which gossip reports about an instance the
// subscriber acts on. A node's Meta is only a claim (any node can say it is
// any instance), so a death, a leave or a revival counts only when it comes
// from the node that the instance's registry record names: the same node
// name and address (serverlist.Instance GossipNode, GossipAddr) for the
// incarnation the record holds. The registry is the truth, and only the
// instance's own publisher may write its record.
//
// A report about another incarnation than the record's (an older life
// already replaced or removed, or a newer one whose record has not reached
// the mirror yet) or about an instance the registry does not hold is
// dropped quietly: acting on it could change nothing the registry does not
// already say. A report about the record's incarnation from any other node,
// or about an instance whose record names no gossip node, is a claim the
// guard refuses: counted (Stats.GossipIgnored) and logged at a bounded
// rate.
//
// It runs on the gossip node's Handler goroutine, one report at a time.
type gossipGuard struct {
	mirror  *serverlist.Mirror
	log     zerolog.Logger // rate-limited
	ignored atomic.Uint64
}

func (g *gossipGuard) init(mirror *serverlist.Mirror, log zerolog.Logger) {
	g.mirror, g.log = mirror, log.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Second})
}

// accept reports whether the subscriber may act on report ("alive",
// "dead", "left") about the instance that m's Meta names.
func (g *gossipGuard) accept(m gossip.Member, report string) bool {
	if m.Meta.Role != gossip.RoleInstance {
		return false
	}
	rec, ok := g.mirror.Get(m.Meta.Service, m.Meta.InstanceID)
	if !ok || rec.Incarnation != m.Meta.Incarnation {
		g.log.Debug().Str("service", m.Meta.Service).Str("id", m.Meta.InstanceID).Int64("incarnation", m.Meta.Incarnation).
			Bool("registered", ok).Int64("registry_incarnation", rec.Incarnation).Str("report", report).
			Msg("gossip: report about an instance life the registry does not hold; nothing to do")
		return false
	}
	if rec.GossipNode != "" && rec.GossipNode == m.Name && rec.GossipAddr == m.Addr {
		return true
	}
	g.ignored.Add(1)
	g.log.Warn().Str("service", m.Meta.Service).Str("id", m.Meta.InstanceID).Int64("incarnation", m.Meta.Incarnation).
		Str("report", report).Str("node", m.Name).Str("addr", m.Addr).
		Str("record_node", rec.GossipNode).Str("record_addr", rec.GossipAddr).
		Msg("gossip: ignored a report about an instance from a node its registry record does not name (a spoofing attempt, or a publisher that does not record its gossip node)")
	return false
}
