package balancer

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a Clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// servers returns n servers named s0..s(n-1) on 10.0.0.x, in zone.
func servers(n int, zone string, from int) []Server {
	out := make([]Server, n)
	for i := range out {
		id := from + i
		out[i] = Server{ID: fmt.Sprintf("s%d", id), Host: fmt.Sprintf("10.0.%d.%d", id/250, id%250+1), Port: 8080, Zone: zone}
	}
	return out
}

// zoned returns count servers in each zone, IDs "<zone><i>".
func zoned(count int, zones ...string) []Server {
	var out []Server
	for zi, z := range zones {
		for i := range count {
			out = append(out, Server{ID: fmt.Sprintf("%s%d", z, i), Host: fmt.Sprintf("10.%d.0.%d", zi, i+1), Port: 80, Zone: z})
		}
	}
	return out
}

type testBalancer struct {
	*Balancer
	clock *fakeClock
}

// newTest builds a started-nothing balancer with a fake clock and seeded rand.
func newTest(t testing.TB, mutate func(*Config), list []Server, opts ...Option) *testBalancer {
	t.Helper()
	cfg := DefaultConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	clk := newFakeClock()
	opts = append([]Option{WithClock(clk), WithRand(testutil.NewRand(42, 42^0x9e3779b97f4a7c15))}, opts...)
	b, err := New("svc", cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if list != nil {
		if err := b.SetServers(list); err != nil {
			t.Fatal(err)
		}
	}
	return &testBalancer{Balancer: b, clock: clk}
}

// trip opens the breaker of the servers with these IDs.
func (tb *testBalancer) trip(t testing.TB, ids ...string) {
	t.Helper()
	for _, id := range ids {
		st := tb.ServerStats(id)
		if st == nil {
			t.Fatalf("no server %q", id)
		}
		for range tb.cfg.Breaker.Threshold {
			st.noteConnectionFailure()
		}
		if !st.CircuitTripped() {
			t.Fatalf("%s not tripped", id)
		}
	}
}

// pickCounts chooses n times and counts picks per ID.
func (tb *testBalancer) pickCounts(t testing.TB, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for range n {
		s, err := tb.Choose(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		counts[s.ID]++
	}
	return counts
}

func keys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// requestFinished records a whole request that got an answer after d:
// what Pick.Done records, for tests that set statistics up directly.
func (s *ServerStats) requestFinished(d time.Duration) {
	s.responseReceived(d)
	s.endRequest()
}
