package balancer

import (
	"slices"
)

// Listener is told about every change of a balancer's list: the list before
// and after, in list order. The first call after AddListener carries an
// empty old list and the current servers. Listeners are called one at a
// time, in the order of the changes, never under the balancer's lock; they
// may call back into the balancer. The slices must not be modified.
type Listener func(old, new []*Server)

type change struct {
	old, new []*Server
	only     Listener // nil: every listener
}

// AddListener registers l and calls it at once with the current list.
func (b *Balancer) AddListener(l Listener) {
	b.mu.Lock()
	b.listeners = append(b.listeners, l)
	cur := b.snap.Load().all
	b.nmu.Lock()
	b.pending = append(b.pending, change{new: cur, only: l})
	b.nmu.Unlock()
	b.mu.Unlock()
	b.notify()
}

// notify drains the change queue unless another goroutine is already
// draining it; listeners run without any lock held.
func (b *Balancer) notify() {
	b.nmu.Lock()
	if b.draining {
		b.nmu.Unlock()
		return
	}
	b.draining = true
	for len(b.pending) > 0 {
		c := b.pending[0]
		// The queue's array would otherwise hold the change's lists
		// (the old one's removed servers) until the next change.
		b.pending[0] = change{}
		b.pending = b.pending[1:]
		if len(b.pending) == 0 {
			b.pending = nil
		}
		b.nmu.Unlock()
		if c.only != nil {
			c.only(c.old, c.new)
		} else {
			b.mu.Lock()
			ls := slices.Clone(b.listeners)
			b.mu.Unlock()
			for _, l := range ls {
				l(c.old, c.new)
			}
		}
		b.nmu.Lock()
	}
	b.draining = false
	b.nmu.Unlock()
}
