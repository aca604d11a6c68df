package subscriber

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkTableOps times the membership table's common operations on a
// service of perService live members: a registry write of a known member
// (the refresh a reconciliation makes of each), an offline and an online
// event of a new incarnation, and the sorted live list a delivery reads.
func BenchmarkTableOps(b *testing.B) {
	for _, perService := range []int{100, 10000} {
		names, ids := instanceIDs(1, perService)
		svc, members := names[0], ids[0]
		m := newMembership()
		now := time.Now()
		for i, id := range members {
			m.registered(svc, id, 1, uint64(i+1), now)
		}
		b.Run(fmt.Sprintf("registered/perService=%d", perService), func(b *testing.B) {
			i := 0
			for b.Loop() {
				m.registered(svc, members[i%perService], 1, uint64(i%perService+1), now)
				i++
			}
		})
		b.Run(fmt.Sprintf("event/perService=%d", perService), func(b *testing.B) {
			inc := int64(1)
			i := 0
			for b.Loop() {
				id := members[i%perService]
				if i%perService == 0 {
					inc++
				}
				m.event(svc, id, inc, i%2 == 0, fromEvent, 0, now)
				i++
			}
		})
		b.Run(fmt.Sprintf("live/perService=%d", perService), func(b *testing.B) {
			for b.Loop() {
				_ = m.live(svc)
			}
		})
	}
}
