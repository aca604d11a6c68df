package balancer_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// factoryConfig has zone a by default, and a client orders with its own
// rule and breaker threshold.
func factoryConfig(t *testing.T) *balancer.ClientsConfig {
	t.Helper()
	cfg := balancer.DefaultClientsConfig()
	cfg.Defaults.Zone = "a"
	orders := cfg.Defaults
	orders.Rule = balancer.RuleRoundRobin
	orders.Breaker.Threshold = 5
	cfg.Clients["orders"] = orders
	return cfg
}

// waitQueued waits until n calls of f are blocked on builds in progress.
func waitQueued(t *testing.T, f *balancer.Factory, n int64) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%d calls queued on builds", n), func() bool {
		return balancer.FactoryWaiting(f) == n
	})
}

// factoryClock is a fixed clock, to check that WithBalancerOptions reaches
// every balancer.
type factoryClock struct{ t time.Time }

func (c factoryClock) Now() time.Time { return c.t }

func TestFactoryGetBuildsOnceWithTheClientConfig(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var clockUsed atomic.Int64
	clockOpt := func(b *balancer.Balancer) error {
		clockUsed.Add(1)
		return balancer.WithClock(factoryClock{time.Unix(1, 0)})(b)
	}
	f, err := balancer.NewFactory(factoryConfig(t), balancer.WithBalancerOptions(clockOpt))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	orders, err := f.Get("orders")
	if err != nil {
		t.Fatal(err)
	}
	again, err := f.Get("orders")
	if err != nil || again != orders {
		t.Fatalf("second Get = %p, %v; want the same balancer %p", again, err, orders)
	}
	if c := orders.Config(); c.Rule != balancer.RuleRoundRobin || c.Breaker.Threshold != 5 || c.Zone != "a" {
		t.Errorf("orders config = %+v", c)
	}
	other, err := f.Get("other")
	if err != nil {
		t.Fatal(err)
	}
	if c := other.Config(); c.Rule != balancer.RuleZoneAvoidance || c.Zone != "a" || c.Breaker.Threshold != 3 {
		t.Errorf("unknown client config = %+v, want the defaults", c)
	}
	if other.Name() != "other" || orders.Name() != "orders" {
		t.Errorf("names: %q %q", orders.Name(), other.Name())
	}
	if n := clockUsed.Load(); n != 2 {
		t.Errorf("balancer option applied %d times, want once per balancer", n)
	}
	if got := f.Names(); !reflect.DeepEqual(got, []string{"orders", "other"}) {
		t.Errorf("Names() = %v", got)
	}
}

func TestFactoryRemove(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	f, err := balancer.NewFactory(factoryConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first, err := f.Get("orders")
	if err != nil {
		t.Fatal(err)
	}
	if !f.Remove("orders") || f.Remove("orders") || f.Remove("never") {
		t.Fatal("Remove reports a balancer only the first time, and only for a built one")
	}
	if got := f.Names(); len(got) != 0 {
		t.Fatalf("Names() after Remove = %v", got)
	}
	if err := first.SetServers(nil); !errors.Is(err, balancer.ErrClosed) {
		t.Fatalf("removed balancer not closed: %v", err)
	}
	again, err := f.Get("orders")
	if err != nil || again == first {
		t.Fatalf("Get after Remove = %p, %v; want a new balancer", again, err)
	}
}

func TestFactoryStartsBalancersAndClosesThem(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var provided []string
	var mu sync.Mutex
	f, err := balancer.NewFactory(nil, balancer.WithServerListProvider(func(name string) balancer.ServerList {
		mu.Lock()
		provided = append(provided, name)
		mu.Unlock()
		if name == "pushed" {
			return nil // fed by SetServers
		}
		return balancer.StaticList{{Host: "127.0.0.1", Port: 9001}}
	}))
	if err != nil {
		t.Fatal(err)
	}
	polled, err := f.Get("polled")
	if err != nil {
		t.Fatal(err)
	}
	if !polled.Polling() {
		t.Fatal("Get did not Start the balancer: no polling for a client with a ServerList")
	}
	pushed, err := f.Get("pushed")
	if err != nil {
		t.Fatal(err)
	}
	if pushed.Polling() {
		t.Error("a client without a ServerList polls")
	}
	if err := pushed.SetServers([]balancer.Server{{Host: "127.0.0.1", Port: 9002}}); err != nil {
		t.Fatal(err)
	}
	if s, err := pushed.Choose(context.Background()); err != nil || s.Port != 9002 {
		t.Errorf("Choose = %v, %v", s, err)
	}
	mu.Lock()
	if !reflect.DeepEqual(provided, []string{"polled", "pushed"}) {
		t.Errorf("provider called for %v", provided)
	}
	mu.Unlock()

	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if polled.Polling() {
		t.Error("Close did not stop the updater")
	}
	for _, b := range []*balancer.Balancer{polled, pushed} {
		if err := b.SetServers(nil); !errors.Is(err, balancer.ErrClosed) {
			t.Errorf("%s after factory Close: SetServers = %v, want ErrClosed", b.Name(), err)
		}
	}
	if b, err := f.Get("polled"); !errors.Is(err, balancer.ErrClosed) || b != nil {
		t.Errorf("Get after Close = %v, %v; want ErrClosed", b, err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if got := f.Names(); len(got) != 0 {
		t.Errorf("Names after Close = %v", got)
	}
}

func TestFactoryConcurrentGet(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var builds sync.Map // name -> *atomic.Int64
	release := make(chan struct{})
	count := func(b *balancer.Balancer) error {
		n, _ := builds.LoadOrStore(b.Name(), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		<-release // hold every build until the other callers queue on it
		return nil
	}
	f, err := balancer.NewFactory(factoryConfig(t), balancer.WithBalancerOptions(count))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	const goroutines = 50
	names := []string{"orders", "a", "b", "c", "d"}
	got := make([]*balancer.Balancer, goroutines)
	errs := make([]error, goroutines)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], errs[i] = f.Get(names[i%len(names)])
		}()
	}
	close(start)
	// One build per name is in progress; every other caller waits for it.
	waitQueued(t, f, goroutines-int64(len(names)))
	close(release)
	wg.Wait()

	byName := map[string]*balancer.Balancer{}
	for i := range goroutines {
		if errs[i] != nil {
			t.Fatalf("Get: %v", errs[i])
		}
		name := names[i%len(names)]
		if prev, ok := byName[name]; ok && prev != got[i] {
			t.Errorf("%s: two balancers %p and %p", name, prev, got[i])
		}
		byName[name] = got[i]
		if got[i].Name() != name {
			t.Errorf("Get(%s) returned %s", name, got[i].Name())
		}
	}
	for _, name := range names {
		n, ok := builds.Load(name)
		if !ok || n.(*atomic.Int64).Load() != 1 {
			t.Errorf("%s built %v times, want exactly 1", name, n)
		}
	}
	if got := f.Names(); len(got) != len(names) {
		t.Errorf("Names() = %v", got)
	}
}

func TestFactoryFailedBuildIsRetried(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var attempts atomic.Int64
	errFlaky := errors.New("flaky option")
	flaky := func(b *balancer.Balancer) error {
		if attempts.Add(1) <= 2 {
			return errFlaky
		}
		return nil
	}
	f, err := balancer.NewFactory(nil, balancer.WithBalancerOptions(flaky))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 2 {
		if _, err := f.Get("orders"); !errors.Is(err, errFlaky) {
			t.Fatalf("attempt %d: %v, want the option's error", i+1, err)
		}
		if got := f.Names(); len(got) != 0 {
			t.Errorf("a failed build is listed: %v", got)
		}
	}
	b, err := f.Get("orders")
	if err != nil || b == nil {
		t.Fatalf("third attempt: %v, want a balancer: failures must not be cached", err)
	}
	if again, _ := f.Get("orders"); again != b || attempts.Load() != 3 {
		t.Errorf("success not cached: %p vs %p after %d attempts", again, b, attempts.Load())
	}
	if _, err := f.Get(""); !errors.Is(err, balancer.ErrInvalidConfig) {
		t.Errorf("Get(\"\") = %v, want ErrInvalidConfig", err)
	}
}

// Callers waiting for a build share its failure.
func TestFactoryWaitersShareAFailure(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	entered := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int64
	errBlocked := errors.New("blocked build failed")
	slow := func(b *balancer.Balancer) error {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
			return errBlocked
		}
		return nil
	}
	f, err := balancer.NewFactory(nil, balancer.WithBalancerOptions(slow))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	results := make(chan error, 5)
	go func() { _, err := f.Get("x"); results <- err }()
	<-entered
	for range 4 {
		go func() { _, err := f.Get("x"); results <- err }()
	}
	waitQueued(t, f, 4)
	close(release)
	shared := 0
	for range 5 {
		select {
		case err := <-results:
			if errors.Is(err, errBlocked) {
				shared++
			} else if err != nil {
				t.Errorf("unexpected error %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Get did not return")
		}
	}
	if shared != 5 {
		t.Errorf("%d of 5 callers got the build's error, want all", shared)
	}
	if b, err := f.Get("x"); err != nil || b == nil {
		t.Errorf("Get after the failure = %v, %v", b, err)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d builds, want 2 (the failed one and one rebuild)", n)
	}
}

// A build in progress when Close is called ends with ErrClosed, and its
// balancer is closed.
func TestFactoryCloseDuringBuild(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	entered := make(chan *balancer.Balancer, 1)
	release := make(chan struct{})
	slow := func(b *balancer.Balancer) error {
		entered <- b
		<-release
		return nil
	}
	f, err := balancer.NewFactory(nil, balancer.WithBalancerOptions(slow),
		balancer.WithServerListProvider(func(string) balancer.ServerList {
			return balancer.StaticList{{Host: "127.0.0.1", Port: 9001}}
		}))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := f.Get("x"); got <- err }()
	b := <-entered
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	waitQueued(t, f, 1) // Close waits for the build
	select {
	case <-closed:
		t.Fatal("Close returned before the build in progress ended")
	default:
	}
	close(release)
	if err := <-got; !errors.Is(err, balancer.ErrClosed) {
		t.Errorf("Get = %v, want ErrClosed", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := b.SetServers(nil); !errors.Is(err, balancer.ErrClosed) {
		t.Errorf("the balancer built during Close is not closed: SetServers = %v", err)
	}
}

func TestFactoryOptionsAndConfigErrors(t *testing.T) {
	bad := balancer.DefaultClientsConfig()
	c := balancer.DefaultConfig()
	c.Breaker.Threshold = 0
	bad.Clients["x"] = c
	if _, err := balancer.NewFactory(bad); !errors.Is(err, balancer.ErrInvalidConfig) || !strings.Contains(err.Error(), `client "x"`) {
		t.Errorf("invalid config: %v", err)
	}
	for i, opt := range []balancer.FactoryOption{
		nil,
		balancer.WithServerListProvider(nil),
		balancer.WithBalancerOptions(nil),
	} {
		if _, err := balancer.NewFactory(nil, opt); !errors.Is(err, balancer.ErrInvalidConfig) {
			t.Errorf("option %d: %v, want ErrInvalidConfig", i, err)
		}
	}
	// The factory keeps its own copy of the configuration.
	cfg := factoryConfig(t)
	f, err := balancer.NewFactory(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o := cfg.Clients["orders"]
	o.Rule = balancer.RuleRandom
	cfg.Clients["orders"] = o
	b, err := f.Get("orders")
	if err != nil {
		t.Fatal(err)
	}
	if b.Config().Rule != balancer.RuleRoundRobin {
		t.Errorf("changing the caller's config after NewFactory changed the factory's: %q", b.Config().Rule)
	}
}

func ExampleFactory() {
	cfg := balancer.DefaultClientsConfig() // or loaded with package lbconfig
	orders := cfg.Defaults
	orders.Rule = balancer.RuleRoundRobin
	orders.ListOfServers = []string{"127.0.0.1:9001"}
	cfg.Clients["orders"] = orders
	f, err := balancer.NewFactory(cfg)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	b, err := f.Get("orders")
	if err != nil {
		panic(err)
	}
	fmt.Println(b.Name(), b.Config().Rule, b.Config().ListOfServers)
	// Output: orders RoundRobin [127.0.0.1:9001]
}
