package dns_test

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/dns"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// startClient starts a pushlb client over a connection of its own to srv,
// closed at cleanup.
func startClient(t testing.TB, srv *natstest.Server, cfg pushlb.Config, opts ...pushlb.Option) *pushlb.Client {
	t.Helper()
	c, err := pushlb.New(srv.Connect(t), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// announceAt announces an instance of service at addr, with a publisher
// on a connection of its own (closed at cleanup).
func announceAt(t testing.TB, srv *natstest.Server, addr string, in serverlist.Instance) *publisher.Publisher {
	t.Helper()
	return testpub.AnnounceAt(t, srv.Connect(t), addr, in)
}

// answerAddrs polls until name's A answer over the responder at addr is
// want (sorted), failing the test after the default timeout.
func answerAddrs(t *testing.T, addr, name string, want ...string) {
	t.Helper()
	slices.Sort(want)
	var got []string
	testutil.Eventually(t, fmt.Sprintf("%s to answer %v", name, want), func() bool {
		m, err := exchange(addr, "udp", name, mdns.TypeA, 0)
		if err != nil || m.Rcode != mdns.RcodeSuccess {
			return false
		}
		got = addrs(m)
		return slices.Equal(got, want)
	})
}

// The responder over a client that follows on request: a query follows a
// service at once; an instance added is answered, one withdrawn is not;
// a service whose last instance left is an empty NOERROR; an unknown name
// is NXDOMAIN and is remembered (one registry read for many queries); an
// instance whose breaker tripped is left out.
func TestClientSource(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	s := startServer(t, dns.ClientSource(c), dns.Config{})
	pubs := map[string]*publisher.Publisher{}
	for i, zone := range []string{"a", "a", "b"} {
		id := fmt.Sprintf("orders-%d", i+1)
		pubs[id] = announceAt(t, srv, fmt.Sprintf("127.0.0.%d:%d", i+1, 9001+i), serverlist.Instance{Service: "orders", InstanceID: id, Zone: zone, Weight: 100 * (i + 1)})
	}
	if _, err := c.Balancer("orders"); err == nil {
		t.Fatal("orders followed before any query")
	}

	// The first query follows it and answers its first list.
	m := ask(t, s.Addr(), "udp", "orders.service.pushlb.", mdns.TypeA)
	if got := addrs(m); !slices.Equal(got, []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}) {
		t.Fatalf("first answer: %v (%s)", got, mdns.RcodeToString[m.Rcode])
	}
	srvm := ask(t, s.Addr(), "tcp", "_orders._tcp.b.service.pushlb.", mdns.TypeSRV)
	var srvs []string
	for _, rr := range srvm.Answer {
		r := rr.(*mdns.SRV)
		srvs = append(srvs, fmt.Sprintf("%d %d %d", r.Priority, r.Weight, r.Port))
	}
	slices.Sort(srvs)
	if want := []string{"1 300 9003", "2 100 9001", "2 200 9002"}; !slices.Equal(srvs, want) {
		t.Errorf("SRV in zone b: %v, want %v", srvs, want)
	}

	// Added, withdrawn.
	announceAt(t, srv, "127.0.0.4:9004", serverlist.Instance{Service: "orders", InstanceID: "orders-4"})
	answerAddrs(t, s.Addr(), "orders.service.pushlb.", "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	if err := pubs["orders-2"].Withdraw(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	answerAddrs(t, s.Addr(), "orders.service.pushlb.", "127.0.0.1", "127.0.0.3", "127.0.0.4")

	// A tripped breaker leaves its instance out.
	b, err := c.Balancer("orders")
	if err != nil {
		t.Fatal(err)
	}
	tripped := b.Server("orders-3")
	for !tripped.Stats().CircuitTripped() {
		p, err := b.Pick(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		p.Done(balancer.DoneInfo{Err: fmt.Errorf("refused"), ConnectFailure: p.Server == tripped})
	}
	answerAddrs(t, s.Addr(), "orders.service.pushlb.", "127.0.0.1", "127.0.0.4")

	// The last instance of a service leaves: an empty NOERROR.
	solo := announceAt(t, srv, "127.0.0.9:9009", serverlist.Instance{Service: "solo", InstanceID: "solo-1"})
	answerAddrs(t, s.Addr(), "solo.service.pushlb.", "127.0.0.9")
	if err := solo.Withdraw(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	answerAddrs(t, s.Addr(), "solo.service.pushlb.")

	// An unknown name: NXDOMAIN, one registry read for many queries.
	before := c.Stats().Follow
	for range 20 {
		if m := ask(t, s.Addr(), "udp", "nobody.service.pushlb.", mdns.TypeA); m.Rcode != mdns.RcodeNameError {
			t.Fatalf("unknown service: %s", mdns.RcodeToString[m.Rcode])
		}
	}
	after := c.Stats().Follow
	if reads := after.NotFound - before.NotFound; reads != 1 {
		t.Errorf("20 queries for an unknown name made %d registry reads, want 1 (then the memory of it: %d hits)", reads, after.NegativeHits-before.NegativeHits)
	}
	if slices.Contains(c.Services(), "nobody") {
		t.Error("an unknown name left a balancer")
	}
}

// dig, the real client: A, SRV with its additional section, TCP.
func TestDig(t *testing.T) {
	dig := testutil.Tool(t, "dig", "dnsutils")
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	s := startServer(t, dns.ClientSource(c), dns.Config{TTL: time.Second})
	announceAt(t, srv, "127.0.0.1:9001", serverlist.Instance{Service: "orders", InstanceID: "o1", Zone: "a", Weight: 250})
	announceAt(t, srv, "localhost:9002", serverlist.Instance{Service: "orders", InstanceID: "o2", Zone: "b"})
	host, port, _ := strings.Cut(s.Addr(), ":")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(dig, append([]string{"@" + host, "-p", port, "+tries=1", "+time=5"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("dig %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := run("+short", "orders.service.pushlb", "A"); strings.TrimSpace(out) != "127.0.0.1" {
		t.Errorf("dig A: %q, want 127.0.0.1 alone (localhost is a name)", out)
	}
	out := run("+tcp", "_orders._tcp.a.service.pushlb", "SRV")
	flat := strings.Join(strings.Fields(out), " ") // dig aligns columns with tabs or spaces
	for _, want := range []string{"status: NOERROR", "flags: qr aa", "1 250 9001 7f000001-9001.addr.pushlb.", "2 100 9002 localhost.", "7f000001-9001.addr.pushlb. 1 IN A 127.0.0.1"} {
		if !strings.Contains(flat, want) {
			t.Errorf("dig SRV: no %q in\n%s", want, out)
		}
	}
	if out := run("nobody.service.pushlb"); !strings.Contains(out, "status: NXDOMAIN") {
		t.Errorf("dig unknown:\n%s", out)
	}
	if out := run("example.com"); !strings.Contains(out, "status: REFUSED") {
		t.Errorf("dig outside the domain:\n%s", out)
	}
}

// A flood of random names, over UDP from many askers at once, through a
// client that follows on request: every query is answered (NXDOMAIN, or
// SERVFAIL while the client's follows are all busy), nothing is followed,
// the goroutines stay within the bound, and a real service is answered
// all along, and the live heap does not grow with the queries.
func TestFloodOfRandomNames(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	s := startServer(t, dns.ClientSource(c), dns.Config{MaxConcurrent: 64})
	announceAt(t, srv, "127.0.0.1:9001", serverlist.Instance{Service: "orders", InstanceID: "o1"})
	answerAddrs(t, s.Addr(), "orders.service.pushlb.", "127.0.0.1")
	base := goroutines()
	heapBefore := liveHeap()

	const askers, each = 32, 300
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	peak := make(chan int, 1)
	go func() { // samples the goroutines while the flood runs
		peakSeen := 0
		tick := time.NewTicker(time.Millisecond) // a sampling period, not an ordering
		defer tick.Stop()
		for {
			peakSeen = max(peakSeen, goroutines())
			select {
			case <-ctx.Done():
				peak <- peakSeen
				return
			case <-tick.C:
			}
		}
	}()
	errs := make(chan error, askers)
	for a := range askers {
		go func() {
			cl := &mdns.Client{Net: "udp", Timeout: 5 * time.Second}
			for i := range each {
				q := new(mdns.Msg)
				q.SetQuestion(fmt.Sprintf("rnd-%d-%d.service.pushlb.", a, i), mdns.TypeA)
				m, _, err := cl.Exchange(q, s.Addr())
				if err != nil {
					errs <- err
					return
				}
				if m.Rcode != mdns.RcodeNameError && m.Rcode != mdns.RcodeServerFailure {
					errs <- fmt.Errorf("%s: %s", q.Question[0].Name, mdns.RcodeToString[m.Rcode])
					return
				}
			}
			errs <- nil
		}()
	}
	for range askers {
		if err := testutil.Receive(t, errs, time.Minute, "an asker's end"); err != nil {
			t.Error(err)
		}
	}
	cancel()
	p := testutil.Receive(t, peak, 10*time.Second, "the peak")
	// The askers' own goroutines and the bound of the responder and the
	// client's follows: far below a goroutine per query.
	if limit := base + askers + 64 + 64 + 50; p > limit {
		t.Errorf("%d goroutines at the peak of %d queries (%d before), want at most %d", p, askers*each, base, limit)
	}
	if got := c.Services(); !slices.Equal(got, []string{"orders"}) {
		t.Errorf("services after the flood: %v, want orders alone", got)
	}
	// What stays is the client's memory of the absent names (bounded at
	// 10,000): well under a few MB, nothing per query.
	grown := liveHeap() - heapBefore
	if grown > 8<<20 {
		t.Errorf("the live heap grew by %d bytes over the flood, want under 8 MB", grown)
	}
	st := s.Stats()
	t.Logf("flood: %d queries, %d NXDOMAIN, %d SERVFAIL; follow stats %+v; peak %d goroutines (%d before); live heap %+d bytes", st.Queries, st.NXDomain, st.ServFail, c.Stats().Follow, p, base, grown)
	answerAddrs(t, s.Addr(), "orders.service.pushlb.", "127.0.0.1")
}

// liveHeap returns the bytes of live heap objects after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// goroutines counts the process's goroutines.
func goroutines() int { return runtime.NumGoroutine() }

// A client with a region answers from the nearest region that has an
// instance: its own, then the next; back to its own when one returns.
func TestClientSourceRegions(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{Region: "eu", RegionPriority: []string{"us"}})
	s := startServer(t, dns.ClientSource(c), dns.Config{})
	eu := announceAt(t, srv, "127.0.0.1:9001", serverlist.Instance{Service: "orders", InstanceID: "eu-1", Region: "eu"})
	announceAt(t, srv, "127.0.0.2:9001", serverlist.Instance{Service: "orders", InstanceID: "us-1", Region: "us"})
	announceAt(t, srv, "127.0.0.3:9001", serverlist.Instance{Service: "orders", InstanceID: "ap-1", Region: "ap"})
	answerAddrs(t, s.Addr(), "orders.service.pushlb.", "127.0.0.1")
	if err := eu.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	answerAddrs(t, s.Addr(), "orders.service.pushlb.", "127.0.0.2")
	announceAt(t, srv, "127.0.0.4:9001", serverlist.Instance{Service: "orders", InstanceID: "eu-2", Region: "EU"})
	answerAddrs(t, s.Addr(), "orders.service.pushlb.", "127.0.0.4")
}
