package lbvisitor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixedResolver is a static Resolver (a fixed source doubles as a test
// fake, as go-kit's do); down makes every lookup fail as an outage would.
type fixedResolver struct {
	mu   sync.Mutex
	ins  map[string]serverlist.Instance
	down bool
}

func (r *fixedResolver) ResolveEach(_ context.Context, service string, ids []string) ([]serverlist.Instance, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	found := make([]serverlist.Instance, len(ids))
	errs := make([]error, len(ids))
	for i, id := range ids {
		switch in, ok := r.ins[id]; {
		case r.down:
			errs[i] = errors.New("registry unreachable")
		case !ok:
			errs[i] = fmt.Errorf("%w: %s/%s", serverlist.ErrNotFound, service, id)
		default:
			found[i] = in
		}
	}
	return found, errs
}

func (r *fixedResolver) set(down bool, ins ...serverlist.Instance) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = down
	if ins != nil {
		r.ins = map[string]serverlist.Instance{}
		for _, in := range ins {
			r.ins[in.InstanceID] = in
		}
	}
}

func inst(i int) serverlist.Instance {
	return serverlist.Instance{Service: "orders", InstanceID: fmt.Sprintf("10.0.0.%d:orders:80", i), Host: fmt.Sprintf("10.0.0.%d", i), Port: 80, Zone: "a", Secure: i == 3}
}

func ids(b *balancer.Balancer) []string {
	var out []string
	for _, s := range b.AllServers() {
		out = append(out, s.ID)
	}
	sort.Strings(out)
	return out
}

func lc(rev uint64, is ...int) events.ListChanged {
	out := events.ListChanged{Service: "orders", Revision: rev}
	for _, i := range is {
		out.InstanceIDs = append(out.InstanceIDs, inst(i).InstanceID)
	}
	return out
}

func newBalancer(t *testing.T) *balancer.Balancer {
	t.Helper()
	cfg := balancer.DefaultConfig()
	cfg.ListOfServers = []string{"127.0.0.1:1"} // a polling source the visitor must stop
	b, err := balancer.New("orders", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestVisitorAppliesListsFromLookups(t *testing.T) {
	b := newBalancer(t)
	res := &fixedResolver{}
	res.set(false, inst(1), inst(2), inst(3))
	v := NewVisitor(b, res, VisitorConfig{})
	if b.Polling() {
		t.Fatal("the visitor must stop polling")
	}
	ctx := t.Context()
	if err := v.Apply(ctx, lc(1, 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if got := ids(b); len(got) != 3 {
		t.Fatalf("got %v", got)
	}
	if s := b.Server(inst(3).InstanceID); s.URLScheme() != "https" || s.Zone != "a" || s.Host != "10.0.0.3" {
		t.Fatalf("registry details not applied: %+v", s)
	}
	st := b.ServerStats(inst(1).InstanceID)
	b.Begin(b.Server(inst(1).InstanceID)) // a request in flight

	// An ID the registry does not hold is left out; the others keep stats.
	if err := v.Apply(ctx, lc(2, 1, 2, 9)); err != nil {
		t.Fatal(err)
	}
	if got := ids(b); !slices.Equal(got, []string{inst(1).InstanceID, inst(2).InstanceID}) {
		t.Fatalf("got %v", got)
	}
	if b.ServerStats(inst(1).InstanceID) != st || st.ActiveRequests() != 1 {
		t.Fatal("stats of a surviving server were lost")
	}
	if v.Stats().NotFound != 1 {
		t.Fatalf("stats %+v", v.Stats())
	}

	// An old revision is ignored.
	if err := v.Apply(ctx, lc(1, 1)); err != nil || len(ids(b)) != 2 || v.Stats().Stale != 1 {
		t.Fatalf("old revision applied: %v %v", ids(b), err)
	}

	// An empty list is a real state when the membership says so.
	if err := v.Apply(ctx, lc(3)); err != nil || len(ids(b)) != 0 {
		t.Fatalf("empty list not applied: %v %v", ids(b), err)
	}
}

func TestVisitorKeepsLastGoodDuringOutage(t *testing.T) {
	b := newBalancer(t)
	res := &fixedResolver{}
	res.set(false, inst(1), inst(2))
	v := NewVisitor(b, res, VisitorConfig{})
	ctx := t.Context()
	if err := v.Apply(ctx, lc(1, 1, 2)); err != nil {
		t.Fatal(err)
	}
	res.set(true)
	// The registry is down: a list that adds 3 and keeps 1 and 2 keeps the
	// known servers; the error asks the subscriber to retry.
	err := v.Apply(ctx, lc(2, 1, 2, 3))
	if !errors.Is(err, ErrKeptLastGood) {
		t.Fatalf("want ErrKeptLastGood, got %v", err)
	}
	if got := ids(b); len(got) != 2 {
		t.Fatalf("outage changed the list: %v", got)
	}
	// Even a list of only unknown IDs does not empty the balancer.
	if err := v.Apply(ctx, lc(3, 3)); !errors.Is(err, ErrKeptLastGood) || len(ids(b)) != 2 {
		t.Fatalf("outage emptied the list: %v, %v", ids(b), err)
	}
	// Back up: the retry converges.
	res.set(false, inst(1), inst(2), inst(3))
	if err := v.Apply(ctx, lc(4, 1, 2, 3)); err != nil || len(ids(b)) != 3 {
		t.Fatalf("after the outage: %v, %v", ids(b), err)
	}
}

// factory is a balancer.Balancers that counts the balancers it makes.
type factory struct {
	mu    sync.Mutex
	made  map[string]int
	bals  map[string]*balancer.Balancer
	delay time.Duration
}

func (f *factory) Get(name string) (*balancer.Balancer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.bals[name]; b != nil {
		return b, nil
	}
	// Simulated slow work (a balancer build that takes a moment), not an
	// ordering: it widens the window in which concurrent Handle calls could
	// create a second balancer; the test's outcome does not depend on it.
	time.Sleep(f.delay)
	b, err := balancer.New(name, balancer.DefaultConfig())
	if err != nil {
		return nil, err
	}
	f.made[name]++
	f.bals[name] = b
	return b, nil
}

func (f *factory) Remove(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.bals[name]
	if b != nil {
		b.Close()
		delete(f.bals, name)
	}
	return b != nil
}

var _ Balancers = (*factory)(nil)
