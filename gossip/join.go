package gossip

import (
	"math/rand/v2"
	"time"
)

// joinLoop joins the configured peers in the background: at once, then with
// exponential backoff while no peer answers. Once the node has company it
// waits until a peer dies or leaves, and if that leaves the node alone it
// starts over, so an instance whose gateways all restarted finds them again.
// It ends on Leave or Close.
func (n *Node) joinLoop() {
	defer n.wg.Done()
	backoff := n.retry.Initial
	for {
		if n.NumMembers() > 1 {
			backoff = n.retry.Initial
			select {
			case <-n.quit:
				return
			case <-n.peerGone:
				continue
			}
		}
		if n.joinOnce() {
			continue
		}
		wait := jitter(backoff)
		n.log.Debug().Dur("retry_in", wait).Strs("join", n.peers).Msg("no gossip peer reachable yet")
		t := time.NewTimer(wait)
		select {
		case <-n.quit:
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, n.retry.Max)
	}
}

// joinOnce tries each peer in turn, checking for a stop between peers so
// that Close waits for one attempt at most. It reports whether one peer
// answered.
func (n *Node) joinOnce() bool {
	for _, peer := range n.peers {
		select {
		case <-n.quit:
			return false
		default:
		}
		count, err := n.ml.Join([]string{peer})
		if count > 0 {
			n.log.Info().Str("peer", peer).Msg("joined gossip cluster")
			return true
		}
		n.log.Debug().Err(err).Str("peer", peer).Msg("gossip join failed")
	}
	n.joinFailures.Add(1)
	return false
}

// jitter spreads d by ±20% so that nodes restarted together do not retry in
// lockstep.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
