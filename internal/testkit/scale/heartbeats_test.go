package scale_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/scale"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// TestHeartbeats: every put of the generator is acknowledged, and a record
// taken out by Replace is never put again once Replace returned, while its
// replacement is. Whether it keeps its schedule (every record once per
// period) is logged: on a loaded machine it may not.
func TestHeartbeats(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	nb := bus{url: srv.URL(), replicas: 1, connect: func(tb testing.TB) *nats.Conn { return srv.Connect(tb) }}
	f, recs, _ := loadFleet(t, nb, scale.Size{Services: 4, Instances: 10, Gateways: 1})

	// Count the puts per key as the server relays them. A marker sent
	// once Replace returned arrives after every put the server had
	// received by then (one connection's messages keep their order):
	// from there on, the keys taken out must not come again.
	var mu sync.Mutex
	puts := map[string]int{}
	var toStop, stopped map[string]bool
	var late []string
	marked := make(chan struct{})
	prefix := "$KV." + serverlist.BucketName(events.DefaultPrefix) + "."
	const marker = "scale.test.marker"
	sub, err := srv.Connect(t).Subscribe(">", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if m.Subject == marker {
			stopped = toStop
			close(marked)
			return
		}
		key, ok := strings.CutPrefix(m.Subject, prefix)
		if !ok {
			return
		}
		key = strings.TrimSuffix(key, ".lease") // a renewal of the record's lease
		puts[key]++
		if stopped[key] {
			late = append(late, key)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	const period = 200 * time.Millisecond // 200 puts/s for 40 records
	h, err := scale.NewHeartbeats(srv.Connect(t), f, recs, period, 64)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan scale.HeartbeatStats)
	go func() {
		st, err := h.Run(ctx)
		if err != nil {
			t.Error(err)
		}
		done <- st
	}()

	// Waits on the puts seen, not on time: the generator's progress is what
	// the checks below need.
	total := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, c := range puts {
			n += c
		}
		return n
	}
	testutil.Eventually(t, "three rounds of heartbeats", func() bool { return total() >= 3*len(recs) })
	// Replace the first two records by new ones, as a churn wave does.
	news, err := scale.Encode(f.Instance(0, 0, 1), f.Instance(0, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Replace(ctx, []int{0, 1}, nil); err != nil {
		t.Fatal(err)
	}
	gone := map[string]bool{}
	for _, in := range []serverlist.Instance{f.Instance(0, 0, 0), f.Instance(0, 1, 0)} {
		key, _ := serverlist.EncodeKey(in.Service, in.InstanceID)
		gone[key] = true
	}
	mu.Lock()
	toStop = gone
	mu.Unlock()
	pub := srv.Connect(t)
	if err := pub.Publish(marker, nil); err != nil {
		t.Fatal(err)
	}
	testutil.Receive(t, marked, 10*time.Second, "the marker")
	// Two more rounds of the records left: each one taken out had its turn
	// twice meanwhile.
	base := total()
	testutil.Eventually(t, "two rounds without the records taken out", func() bool { return total() >= base+2*(len(recs)-2) })
	if err := h.Replace(ctx, []int{0, 1}, news); err != nil {
		t.Fatal(err)
	}
	refreshed := func(in serverlist.Instance) int {
		key, _ := serverlist.EncodeKey(in.Service, in.InstanceID)
		mu.Lock()
		defer mu.Unlock()
		return puts[key]
	}
	testutil.Eventually(t, "the replacements refreshed", func() bool {
		return refreshed(f.Instance(0, 0, 1)) >= 2 && refreshed(f.Instance(0, 1, 1)) >= 2
	})
	cancel()
	st := <-done

	if st.Failed != 0 || st.Acked != st.Sent || st.Skipped == 0 {
		t.Errorf("heartbeats %+v: want every put acknowledged, the records taken out skipped", st)
	}
	// Whether it kept up with its schedule depends on the machine's load:
	// a figure for the benchmarks (BenchmarkHeartbeatCPU reports it), not
	// a verdict here.
	t.Logf("%.0f puts/s for %.0f due, kept up: %v", st.Rate(), float64(len(recs))/period.Seconds(), st.KeptUp())
	mu.Lock()
	defer mu.Unlock()
	if len(late) > 0 {
		t.Errorf("records taken out were put again: %v", late)
	}
	for i, in := range []serverlist.Instance{f.Instance(0, 0, 1), f.Instance(0, 1, 1)} {
		key, _ := serverlist.EncodeKey(in.Service, in.InstanceID)
		if puts[key] == 0 {
			t.Errorf("replacement %d (%s) never refreshed", i, key)
		}
	}
}
