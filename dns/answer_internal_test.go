package dns

import (
	"fmt"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/pushlb/pushlb/balancer"
)

// BenchmarkBuildAnswer is the responder's own work for one A answer of
// 10 records, without the network: what it adds to the library's.
func BenchmarkBuildAnswer(b *testing.B) {
	list := make([]balancer.Server, 10)
	for i := range list {
		list[i] = balancer.Server{ID: fmt.Sprint(i), Host: "127.0.0.1", Port: 9000 + i}
	}
	s, err := New(NewStatic(map[string][]balancer.Server{"orders": list}), Config{})
	if err != nil {
		b.Fatal(err)
	}
	q := new(mdns.Msg)
	q.SetQuestion("orders.service.pushlb.", mdns.TypeA)
	b.ReportAllocs()
	for b.Loop() {
		ctx := &queryContext{}
		if m := s.answer(ctx, q, false); len(m.Answer) != 10 {
			b.Fatal(m)
		}
	}
}
