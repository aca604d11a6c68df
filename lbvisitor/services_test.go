package lbvisitor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

func newFactory(t *testing.T) *factory {
	f := &factory{made: map[string]int{}, bals: map[string]*balancer.Balancer{}}
	t.Cleanup(func() {
		for _, b := range f.bals {
			b.Close()
		}
	})
	return f
}

// newServices is a table over a new factory, resolving inst(1).
func newServices(t *testing.T) (*factory, *fixedResolver, *Services) {
	f := newFactory(t)
	res := &fixedResolver{}
	res.set(false, inst(1))
	s := NewServices(f, ServicesConfig{})
	s.Resolve(res)
	return f, res, s
}

func TestServicesBuildOneBalancerPerService(t *testing.T) {
	f, _, s := newServices(t)
	f.delay = time.Millisecond
	handle := s.Handle
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			svc := []string{"orders", "billing"}[i%2]
			handle(t.Context(), events.ListChanged{Service: svc, InstanceIDs: []string{inst(1).InstanceID}, Revision: uint64(i + 1)})
		})
	}
	wg.Wait()
	if f.made["orders"] != 1 || f.made["billing"] != 1 {
		t.Fatalf("balancers made: %v", f.made)
	}
	if got := s.Names(); !slices.Equal(got, []string{"billing", "orders"}) {
		t.Fatalf("services %v", got)
	}
	if err := handle(t.Context(), events.ListChanged{Service: "orders", InstanceIDs: []string{inst(1).InstanceID}, Revision: 100}); err != nil {
		t.Fatal(err)
	}
	if len(s.Lookup("orders").Balancer().AllServers()) != 1 {
		t.Fatal("the service's visitor did not apply the list")
	}
}

// A list naming only IDs nobody registered builds no balancer, and an
// outage for a new service is an error (the subscriber retries).
func TestServicesBuildNothingForUnregisteredIDs(t *testing.T) {
	f, res, s := newServices(t)
	handle := s.Handle
	for i := range 100 {
		lc := events.ListChanged{Service: fmt.Sprintf("invented-%d", i), InstanceIDs: []string{"ghost"}, Revision: 1}
		if err := handle(t.Context(), lc); err != nil {
			t.Fatal(err)
		}
	}
	if err := handle(t.Context(), events.ListChanged{Service: "empty", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	if len(f.made) != 0 || len(s.Names()) != 0 || s.Unregistered() != 101 {
		t.Fatalf("made %v, services %v, unregistered %d", f.made, s.Names(), s.Unregistered())
	}
	res.set(true)
	if err := handle(t.Context(), events.ListChanged{Service: "orders", InstanceIDs: []string{inst(1).InstanceID}, Revision: 1}); err == nil {
		t.Fatal("an outage for a new service must be an error")
	}
	if len(f.made) != 0 {
		t.Fatalf("made %v during an outage", f.made)
	}
	if s.Unfollow("nobody", func(*Service) bool { return true }) {
		t.Fatal("Unfollow of an unknown service reported true")
	}
}

// An unfollowed service's visitor refuses lists; the next list follows the
// service anew, with a new balancer.
func TestServicesUnfollow(t *testing.T) {
	f, _, s := newServices(t)
	handle := s.Handle
	lc := events.ListChanged{Service: "orders", InstanceIDs: []string{inst(1).InstanceID}, Revision: 1}
	if err := handle(t.Context(), lc); err != nil {
		t.Fatal(err)
	}
	old := s.Lookup("orders")
	if s.Unfollow("orders", func(sv *Service) bool { return len(sv.Balancer().AllServers()) == 0 }) {
		t.Fatal("removed a service whose cond is false")
	}
	if !s.Unfollow("orders", func(*Service) bool { return true }) || len(s.Names()) != 0 || s.Removed() != 1 {
		t.Fatal("Unfollow did not remove")
	}
	if _, held := f.bals["orders"]; held {
		t.Fatal("Unfollow did not release the balancer")
	}
	if err := old.Visitor().Apply(t.Context(), lc); !errors.Is(err, ErrRemoved) {
		t.Fatalf("Apply on a removed visitor: %v", err)
	}
	lc.Revision = 2
	if err := handle(t.Context(), lc); err != nil {
		t.Fatal(err)
	}
	if sv := s.Lookup("orders"); sv == nil || sv == old || sv.Balancer() == old.Balancer() {
		t.Fatal("Handle reused the unfollowed service")
	}
}

// gatedResolver resolves like fixedResolver, but each call first says so on
// entered and waits for release.
type gatedResolver struct {
	fixedResolver
	entered, release chan struct{}
}

func (r *gatedResolver) ResolveEach(ctx context.Context, service string, ids []string) ([]serverlist.Instance, []error) {
	r.entered <- struct{}{}
	<-r.release
	return r.fixedResolver.ResolveEach(ctx, service, ids)
}

// A service that a pushed list builds is seen by requests, watchers and
// Names only once its first list is installed: while its lookups run, a
// request finds no service (unknown), never a service without servers.
func TestServicesPublishAtTheFirstList(t *testing.T) {
	f := newFactory(t)
	res := &gatedResolver{entered: make(chan struct{}), release: make(chan struct{})}
	res.set(false, inst(1), inst(2))
	s := NewServices(f, ServicesConfig{})
	var mu sync.Mutex
	var watched [][]string
	stop := s.Watch("orders", func(servers []*balancer.Server) {
		mu.Lock()
		defer mu.Unlock()
		var ids []string
		for _, srv := range servers {
			ids = append(ids, srv.ID)
		}
		watched = append(watched, ids)
	})
	defer stop()
	var names [][]string
	stopNames := s.WatchNames(func(n []string) { names = append(names, n) })
	defer stopNames()

	s.Resolve(res)
	done := make(chan error, 1)
	go func() { done <- s.Handle(t.Context(), lc(1, 1, 2)) }()
	for range 2 { // the check that an ID resolves, then the list's lookups
		<-res.entered
		if b, err := s.Balancers().Get("orders"); !errors.Is(err, ErrUnknownService) {
			t.Fatalf("a request during the first list's lookups found %v (%v)", b, err)
		}
		if s.Lookup("orders") != nil || len(s.Names()) != 0 {
			t.Fatal("the service was published before its first list")
		}
		res.release <- struct{}{}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b, err := s.Balancers().Get("orders")
	if err != nil || len(b.AllServers()) != 2 {
		t.Fatalf("after the first list: %v, %v", b, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if last := watched[len(watched)-1]; len(last) != 2 || len(watched[0]) != 0 {
		t.Fatalf("the watch saw %v", watched)
	}
	if !slices.Equal(names[len(names)-1], []string{"orders"}) {
		t.Fatalf("the names' watch saw %v", names)
	}
}

// A first list that installs nothing (its lookups failed) leaves nothing
// behind: no balancer, no service.
func TestServicesDropAFirstListThatInstallsNothing(t *testing.T) {
	f := newFactory(t)
	res := &flakyResolver{}
	res.set(false, inst(1))
	s := NewServices(f, ServicesConfig{})
	s.Resolve(res)
	res.failAfter = 1 // the check that an ID resolves passes, the list's lookups fail
	if err := s.Handle(t.Context(), lc(1, 1)); !errors.Is(err, ErrKeptLastGood) {
		t.Fatalf("want ErrKeptLastGood, got %v", err)
	}
	if len(f.bals) != 0 || s.Lookup("orders") != nil {
		t.Fatalf("left behind: balancers %v", f.bals)
	}
	res.failAfter = -1
	if err := s.Handle(t.Context(), lc(2, 1)); err != nil || s.Lookup("orders") == nil {
		t.Fatalf("the retry did not follow the service: %v", err)
	}
}

// flakyResolver fails every call after its first failAfter (< 0: never).
type flakyResolver struct {
	fixedResolver
	calls, failAfter int
}

func (r *flakyResolver) ResolveEach(ctx context.Context, service string, ids []string) ([]serverlist.Instance, []error) {
	r.calls++
	if r.failAfter >= 0 && r.calls > r.failAfter {
		errs := make([]error, len(ids))
		for i := range errs {
			errs[i] = errors.New("registry unreachable")
		}
		return make([]serverlist.Instance, len(ids)), errs
	}
	return r.fixedResolver.ResolveEach(ctx, service, ids)
}

// The cause of each change travels with the list that makes it: the
// observer hears each server with the cause the ListChanged records for
// it, else the list's own; a static list's changes are the
// configuration's; a change is told once, by whoever made it.
func TestServicesTellEachChangeWithItsCause(t *testing.T) {
	var mu sync.Mutex
	var heard []ListChange
	f := newFactory(t)
	res := &fixedResolver{}
	res.set(false, inst(1), inst(2), inst(3))
	s := NewServices(f, ServicesConfig{Observer: func(lc ListChange) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, lc)
	}})
	sv, err := s.Follow("orders")
	if err != nil {
		t.Fatal(err)
	}
	// A list from elsewhere than the push path: a static one's.
	if err := sv.Balancer().SetServers([]balancer.Server{{Host: "127.0.0.1", Port: 1}}); err != nil {
		t.Fatal(err)
	}
	s.Resolve(res)
	handle := s.Handle
	at := time.Now().Add(-time.Second)
	first := lc(1, 1, 2)
	first.Cause = events.CauseResync
	first.Changes = map[string]events.Change{inst(2).InstanceID: {Cause: events.CauseAnnounce, EventAt: at}}
	if err := handle(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	second := lc(2, 2, 3)
	second.Changes = map[string]events.Change{inst(1).InstanceID: {Cause: events.CauseOffline, EventAt: at}}
	if err := handle(t.Context(), second); err != nil {
		t.Fatal(err)
	}
	if err := handle(t.Context(), lc(3, 2, 3)); err != nil { // no change: nothing told
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	causes := func(cs []ServerChange) (out []string) {
		for _, c := range cs {
			out = append(out, c.Server.ID+"="+string(c.Cause))
		}
		slices.Sort(out)
		return out
	}
	want := [][2][]string{
		{{"127.0.0.1:1=config"}, nil},
		{{inst(1).InstanceID + "=resync", inst(2).InstanceID + "=announce"}, {"127.0.0.1:1=resync"}},
		{{inst(3).InstanceID + "=registry"}, {inst(1).InstanceID + "=offline"}},
	}
	if len(heard) != len(want) {
		t.Fatalf("heard %d changes, want %d: %+v", len(heard), len(want), heard)
	}
	for i, w := range want {
		if j, l := causes(heard[i].Joined), causes(heard[i].Left); !slices.Equal(j, w[0]) || !slices.Equal(l, w[1]) {
			t.Errorf("change %d: joined %v left %v, want %v %v", i, j, l, w[0], w[1])
		}
	}
	for _, c := range heard[1].Joined {
		if (c.Server.ID == inst(2).InstanceID) != !c.EventAt.IsZero() {
			t.Errorf("%s: event time %v", c.Server.ID, c.EventAt)
		}
	}
	if sv.Updates() != 3 || sv.LastChange().IsZero() {
		t.Fatalf("counted %d updates, last at %v", sv.Updates(), sv.LastChange())
	}
}

// guardFunc is a Guard of one function.
type guardFunc func(events.ListChanged, []*balancer.Server) error

func (g guardFunc) Admit(lc events.ListChanged, listed []*balancer.Server) error {
	return g(lc, listed)
}

// The guard sees every list with what the balancer lists, and has the last
// word on a list that would empty it because none of its IDs is
// registered any more: it sees that list again as its lookups left it,
// empty, each ID removed by the registry. What it refuses leaves the list
// as it was.
func TestVisitorGuard(t *testing.T) {
	b := newBalancer(t)
	res := &fixedResolver{}
	res.set(false, inst(1), inst(2))
	refuse := errors.New("held")
	var admitted []int // listed sizes
	var seen []events.ListChanged
	refuseEmpty := false
	v := NewVisitor(b, res, VisitorConfig{Guard: guardFunc(func(lc events.ListChanged, listed []*balancer.Server) error {
		admitted, seen = append(admitted, len(listed)), append(seen, lc)
		if refuseEmpty && len(lc.InstanceIDs) == 0 {
			return refuse
		}
		if len(lc.InstanceIDs) == 1 && lc.InstanceIDs[0] == inst(1).InstanceID {
			return refuse
		}
		return nil
	})})
	ctx := t.Context()
	if err := v.Apply(ctx, lc(1, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if err := v.Apply(ctx, lc(2, 1)); !errors.Is(err, refuse) || len(ids(b)) != 2 {
		t.Fatalf("a refused list was applied: %v, %v", ids(b), err)
	}
	res.set(false, inst(3)) // the records of 1 and 2 are gone
	refuseEmpty = true
	if err := v.Apply(ctx, lc(3, 1, 2)); !errors.Is(err, refuse) || len(ids(b)) != 2 {
		t.Fatalf("the refusal of the list the lookups emptied did not keep the list: %v, %v", ids(b), err)
	}
	emptied := seen[len(seen)-1]
	if len(emptied.InstanceIDs) != 0 || len(emptied.Changes) != 2 ||
		emptied.Changes[inst(1).InstanceID].Cause != events.CauseRegistry || emptied.Changes[inst(2).InstanceID].Cause != events.CauseRegistry {
		t.Fatalf("the list as the lookups left it: IDs %v, changes %v; want none, 1 and 2 removed by the registry", emptied.InstanceIDs, emptied.Changes)
	}
	refuseEmpty = false
	if err := v.Apply(ctx, lc(4, 1, 2)); err != nil || len(ids(b)) != 0 {
		t.Fatalf("an admitted empty list was not applied: %v, %v", ids(b), err)
	}
	if err := v.Apply(ctx, lc(5, 9)); err != nil { // empty already: asked once
		t.Fatal(err)
	}
	if !slices.Equal(admitted, []int{0, 2, 2, 2, 2, 2, 0}) {
		t.Fatalf("Admit saw lists of %v servers", admitted)
	}
}

// A list whose lookups miss a record that went meanwhile is shown to the
// guard a second time as the lookups left it: the IDs found, the missing
// one a registry removal. Without it the guard sees no loss in that list
// (a guard's run of removals began at the wrong size).
func TestVisitorGuardSeesALossAtLookup(t *testing.T) {
	b := newBalancer(t)
	res := &fixedResolver{}
	res.set(false, inst(1), inst(2))
	var seen []events.ListChanged
	var sizes []int
	v := NewVisitor(b, res, VisitorConfig{Guard: guardFunc(func(lc events.ListChanged, listed []*balancer.Server) error {
		seen, sizes = append(seen, lc), append(sizes, len(listed))
		return nil
	})})
	if err := v.Apply(t.Context(), lc(1, 1, 2)); err != nil {
		t.Fatal(err)
	}
	res.set(false, inst(2)) // 1's record went before the next list's lookups
	if err := v.Apply(t.Context(), lc(2, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if got := ids(b); !slices.Equal(got, []string{inst(2).InstanceID}) {
		t.Fatalf("listed %v, want 2 only", got)
	}
	if len(seen) != 3 || !slices.Equal(sizes, []int{0, 2, 2}) {
		t.Fatalf("Admit called %d times with listed sizes %v, want 3: the lists, then the second as its lookups left it", len(seen), sizes)
	}
	last := seen[2]
	if !slices.Equal(last.InstanceIDs, []string{inst(2).InstanceID}) || last.Changes[inst(1).InstanceID].Cause != events.CauseRegistry || len(last.Changes) != 1 {
		t.Fatalf("the second Admit of the list: IDs %v, changes %v; want 2's, and 1 removed by the registry", last.InstanceIDs, last.Changes)
	}
}

// A record rewritten under the same instance ID (another weight) is a
// change of the list: the observer hears it as Updated, and the service's
// watchers are called with the new list.
func TestServicesTellAChangeInPlace(t *testing.T) {
	var mu sync.Mutex
	var heard []ListChange
	f := newFactory(t)
	res := &fixedResolver{}
	res.set(false, inst(1), inst(2))
	s := NewServices(f, ServicesConfig{Observer: func(lc ListChange) {
		mu.Lock()
		defer mu.Unlock()
		heard = append(heard, lc)
	}})
	s.Resolve(res)
	if err := s.Handle(t.Context(), lc(1, 1, 2)); err != nil {
		t.Fatal(err)
	}
	weights := make(chan int, 4)
	stop := s.Watch("orders", func(servers []*balancer.Server) {
		for _, sv := range servers {
			if sv.ID == inst(2).InstanceID {
				weights <- sv.Weight
			}
		}
	})
	defer stop()
	if w := testutil.Receive(t, weights, time.Minute, "the first list"); w != 0 {
		t.Fatalf("weight %d at first, want 0 (the default)", w)
	}
	heavier := inst(2)
	heavier.Weight = 500
	res.set(false, inst(1), heavier)
	if err := s.Handle(t.Context(), lc(2, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if w := testutil.Receive(t, weights, time.Minute, "the list after the change in place"); w != 500 {
		t.Fatalf("weight %d after the change, want 500", w)
	}
	mu.Lock()
	defer mu.Unlock()
	last := heard[len(heard)-1]
	if len(last.Joined) != 0 || len(last.Left) != 0 || len(last.Updated) != 1 || last.Updated[0].Server.ID != inst(2).InstanceID {
		t.Fatalf("heard joined %v, left %v, updated %v; want %s updated alone", last.Joined, last.Left, last.Updated, inst(2).InstanceID)
	}
}
