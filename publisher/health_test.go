package publisher_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// flakyBackend is a real HTTP backend whose /health answers 200 while
// healthy is set and 503 otherwise.
func flakyBackend(t *testing.T) (*httptest.Server, *atomic.Bool) {
	t.Helper()
	var healthy atomic.Bool
	healthy.Store(true)
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && !healthy.Load() {
			http.Error(w, "failing", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	t.Cleanup(b.Close)
	return b, &healthy
}

// httpCheck GETs url and fails on anything but 2xx.
func httpCheck(url string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// gatewayLists starts a subscriber (a gateway's view of the registry and
// the events) whose deliveries of "orders" arrive on the returned channel.
func gatewayLists(t *testing.T, r *rig) (*subscriber.Subscriber, chan []string) {
	t.Helper()
	lists := make(chan []string, 64)
	sub, err := subscriber.New(r.srv.Connect(t), r.reg, func(_ context.Context, lc events.ListChanged) error {
		if lc.Service == "orders" {
			lists <- slices.Clone(lc.InstanceIDs)
		}
		return nil
	}, subscriber.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return sub, lists
}

// waitList reads deliveries until one holds id (in true) or lacks it.
func waitList(t *testing.T, lists chan []string, id string, in bool, what string) {
	t.Helper()
	for {
		if l := testutil.Receive(t, lists, 10*time.Second, what); slices.Contains(l, id) == in {
			return
		}
	}
}

// TestWatchHealthDownAndUp: a backend whose health URL starts failing is
// taken out of the gateway's list after exactly Failures failed checks
// (offline event, record removed: a fresh gateway's resync does not bring
// it back), and back in after the first passing check, with the same
// incarnation.
func TestWatchHealthDownAndUp(t *testing.T) {
	r := newRig(t, 3*time.Second)
	_, lists := gatewayLists(t, r)
	backend, healthy := flakyBackend(t)
	p, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	on := r.next(t)
	waitList(t, lists, orders.InstanceID, true, "the instance listed")

	type change struct {
		up       bool
		cause    error
		err      error
		failures int
	}
	var failures atomic.Int64
	changes := make(chan change, 8)
	ctx, cancel := context.WithCancel(t.Context())
	watched := make(chan error, 1)
	go func() {
		watched <- p.WatchHealth(ctx, publisher.HealthConfig{
			Check:    httpCheck(backend.URL + "/health"),
			Interval: 20 * time.Millisecond,
			Failures: 3,
			OnCheck:  func(_ error, n int) { failures.Store(int64(n)) },
			OnChange: func(up bool, cause, err error) {
				changes <- change{up: up, cause: cause, err: err, failures: int(failures.Load())}
			},
		})
	}()

	healthy.Store(false)
	c := testutil.Receive(t, changes, 10*time.Second, "the instance marked down")
	if c.up || c.err != nil || c.failures != 3 || c.cause == nil {
		t.Fatalf("change %+v, want down after 3 failures", c)
	}
	off := r.next(t)
	if off.Kind != events.Offline || off.Incarnation != on.Incarnation || !strings.HasPrefix(off.Reason, publisher.DownReasonPrefix+": ") || !strings.Contains(off.Reason, "503") {
		t.Fatalf("offline event %+v", off)
	}
	waitList(t, lists, orders.InstanceID, false, "the instance removed")
	if !p.Down() || r.registered(t, orders.InstanceID) {
		t.Fatalf("down %v, registered %v: want down and no record", p.Down(), r.registered(t, orders.InstanceID))
	}
	// A gateway that starts now (or resyncs) does not route it either.
	fresh, _ := gatewayLists(t, r)
	if slices.Contains(fresh.Live()["orders"], orders.InstanceID) {
		t.Fatal("a fresh gateway's resync lists the down instance")
	}

	healthy.Store(true)
	c = testutil.Receive(t, changes, 10*time.Second, "the instance marked up")
	if !c.up || c.err != nil {
		t.Fatalf("change %+v, want up", c)
	}
	back := r.next(t)
	if back.Kind != events.Online || back.Incarnation != on.Incarnation {
		t.Fatalf("event %+v, want online with incarnation %d", back, on.Incarnation)
	}
	waitList(t, lists, orders.InstanceID, true, "the instance listed again")
	if p.Down() || !r.registered(t, orders.InstanceID) {
		t.Fatal("not up and registered after MarkUp")
	}

	cancel()
	if err := testutil.Receive(t, watched, 10*time.Second, "WatchHealth's end"); !errors.Is(err, context.Canceled) {
		t.Fatalf("WatchHealth: %v", err)
	}
	if err := p.Withdraw(t.Context(), "shutdown"); err != nil {
		t.Fatal(err)
	}
	if e := r.next(t); e.Kind != events.Offline || e.Reason != "shutdown" {
		t.Fatalf("event %+v", e)
	}
}

// TestMarkDownMarkUpRules: the states MarkDown and MarkUp accept, and
// Withdraw of a down instance.
func TestMarkDownMarkUpRules(t *testing.T) {
	r := newRig(t, 3*time.Second)
	p, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.MarkDown(t.Context(), ""); !errors.Is(err, publisher.ErrNotAnnounced) {
		t.Fatalf("MarkDown before Announce: %v", err)
	}
	if err := p.MarkUp(t.Context()); !errors.Is(err, publisher.ErrNotAnnounced) {
		t.Fatalf("MarkUp before Announce: %v", err)
	}
	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	r.next(t)
	if err := p.MarkUp(t.Context()); err != nil { // up already: nothing
		t.Fatal(err)
	}
	for range 2 { // the second does nothing
		if err := p.MarkDown(t.Context(), ""); err != nil {
			t.Fatal(err)
		}
	}
	if e := r.next(t); e.Kind != events.Offline || e.Reason != publisher.DownReasonPrefix {
		t.Fatalf("event %+v", e)
	}
	if r.registered(t, orders.InstanceID) {
		t.Fatal("registered while down")
	}
	// The record stays, marked down, and its lease goes on.
	held, err := r.reg.GetEntry(t.Context(), "orders", orders.InstanceID)
	if err != nil || held.Status != serverlist.StatusDown || held.Owner != p.Owner() {
		t.Fatalf("record while down: %+v, %v; want it kept, marked down", held, err)
	}
	lease, err := r.reg.LeaseRevision(t.Context(), "orders", orders.InstanceID)
	if err != nil || lease == 0 {
		t.Fatalf("lease while down: revision %d, %v", lease, err)
	}
	// Withdraw of a down instance publishes nothing more, and removes
	// the record.
	if err := p.Withdraw(t.Context(), "shutdown"); err != nil {
		t.Fatal(err)
	}
	if err := p.MarkUp(t.Context()); !errors.Is(err, publisher.ErrNotAnnounced) {
		t.Fatalf("MarkUp after Withdraw: %v", err)
	}
	if _, err := r.reg.GetEntry(t.Context(), "orders", orders.InstanceID); !errors.Is(err, serverlist.ErrNotFound) {
		t.Fatalf("record after Withdraw of a down instance: %v", err)
	}
	// The next event is the barrier's: nothing came in between.
	in2 := orders
	in2.InstanceID = "barrier"
	if err := p.Announce(t.Context(), in2); err != nil {
		t.Fatal(err)
	}
	if e := r.next(t); e.InstanceID != "barrier" {
		t.Fatalf("event %+v after withdrawing a down instance", e)
	}
	p.Close()
	if err := p.MarkDown(t.Context(), ""); !errors.Is(err, publisher.ErrClosed) {
		t.Fatalf("MarkDown after Close: %v", err)
	}
}

// TestMarkUpYieldsToANewerProcess: a process that took the ID over while
// the instance was down keeps it: MarkUp yields. The down instance still
// holds its record (marked down) and renews its lease, so the newer
// process takes the ID over with Replace, as a replacement started beside
// a live process must (the identity rule).
func TestMarkUpYieldsToANewerProcess(t *testing.T) {
	r := newRig(t, 3*time.Second)
	old, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	in := orders
	in.Incarnation = time.Now().UnixNano()
	if err := old.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	if err := old.MarkDown(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	newer, err := publisher.New(r.nc, r.reg, publisher.Config{Replace: true})
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close()
	in.Incarnation++
	if err := newer.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	if err := old.MarkUp(t.Context()); !errors.Is(err, publisher.ErrReplaced) {
		t.Fatalf("MarkUp: %v, want ErrReplaced", err)
	}
	testutil.Receive(t, old.Replaced(), time.Second, "Replaced closed")
	e, err := r.reg.GetEntry(t.Context(), in.Service, in.InstanceID)
	if err != nil || e.Owner != newer.Owner() {
		t.Fatalf("record %+v, %v: want the newer process's", e, err)
	}
}

func TestWatchHealthConfig(t *testing.T) {
	r := newRig(t, 3*time.Second)
	p, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ok := func(context.Context) error { return nil }
	for _, h := range []publisher.HealthConfig{
		{},
		{Check: ok, Interval: -time.Second},
		{Check: ok, Failures: -1},
		{Check: ok, Timeout: -time.Second},
	} {
		if err := p.WatchHealth(t.Context(), h); !errors.Is(err, publisher.ErrInvalidConfig) {
			t.Errorf("WatchHealth(%+v): %v, want ErrInvalidConfig", h, err)
		}
	}
	// Not announced: the first change says so and ends the watch.
	fail := func(context.Context) error { return errors.New("down") }
	if err := p.WatchHealth(t.Context(), publisher.HealthConfig{Check: fail, Interval: time.Millisecond, Failures: 1}); !errors.Is(err, publisher.ErrNotAnnounced) {
		t.Fatalf("WatchHealth before Announce: %v", err)
	}
}

// TestMarkDownReasonFits: a check's error of any bytes and length becomes
// a valid offline reason (UTF-8, within events.MaxReasonLength).
func TestMarkDownReasonFits(t *testing.T) {
	r := newRig(t, 3*time.Second)
	p, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	r.next(t)
	if err := p.MarkDown(t.Context(), "x\xff"+strings.Repeat("é", 200)); err != nil {
		t.Fatal(err)
	}
	e := r.next(t)
	if e.Kind != events.Offline || len(e.Reason) > events.MaxReasonLength || len(e.Reason) < events.MaxReasonLength-1 || !strings.HasPrefix(e.Reason, "x?é") {
		t.Fatalf("reason %q (%d bytes)", e.Reason, len(e.Reason))
	}
}
