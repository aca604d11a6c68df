package pushlb

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/pushlb/pushlb/balancer"
)

// Counting a service's reachable servers (Client.Stats, the gateway's
// metrics and pages read it for every service) allocates no statistics
// for servers that have had no request: a follow-all client of 100,000
// instances would otherwise hold 8 MB more.
func TestReachableAllocatesNoStatistics(t *testing.T) {
	b, err := balancer.New("svc", balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	list := make([]balancer.Server, 1000)
	for i := range list {
		list[i] = balancer.Server{ID: fmt.Sprint("i", i), Host: "10.0.0.1", Port: 1000 + i}
	}
	if err := b.SetServers(list); err != nil {
		t.Fatal(err)
	}
	v := Balancer{b}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	reachable, ejected := v.reachable()
	runtime.ReadMemStats(&after)
	if reachable != 1000 || ejected != 0 {
		t.Fatalf("reachable %d, ejected %d; want 1000, 0", reachable, ejected)
	}
	if n := after.Mallocs - before.Mallocs; n > 100 {
		t.Fatalf("counting 1,000 servers made %d allocations", n)
	}
	if n := len(v.Reachable()); n != 1000 {
		t.Fatalf("Reachable: %d servers", n)
	}
}
