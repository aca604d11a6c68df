package balancer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pushlb/pushlb/balancer"
)

// primaryFirst is a rule written outside package balancer: it sends
// requests to the servers whose metadata says role=primary, in list
// order, while their breaker is closed, and round robin to the servers
// with a closed breaker when no primary is usable. All it needs comes
// with the PickInfo.
type primaryFirst struct {
	next atomic.Uint64 // round-robin position over the others
}

func (r *primaryFirst) Choose(p balancer.PickInfo) (*balancer.Server, error) {
	list := p.View.Servers()
	for _, s := range list {
		if s.Metadata["role"] == "primary" && !p.Tripped(s) {
			return s, nil
		}
	}
	if len(list) == 0 {
		return nil, nil // the balancer answers ErrNoServers
	}
	start := int(r.next.Add(1) % uint64(len(list)))
	for i := range list {
		if s := list[(start+i)%len(list)]; !p.Tripped(s) {
			return s, nil
		}
	}
	return list[start], nil // every breaker is open: any server
}

var _ balancer.Rule = (*primaryFirst)(nil)

// A custom rule is plugged in with WithRule; picks report their outcome
// through the Pick, which feeds the statistics the rule reads.
func ExampleRule() {
	b, err := balancer.New("orders", balancer.DefaultConfig(), balancer.WithRule(&primaryFirst{}))
	if err != nil {
		panic(err)
	}
	defer b.Close()
	b.SetServers([]balancer.Server{
		{ID: "replica", Host: "10.0.0.2", Port: 8080},
		{ID: "primary", Host: "10.0.0.1", Port: 8080, Metadata: map[string]string{"role": "primary"}},
	})
	ctx := context.Background()

	for range 3 {
		p, err := b.Pick(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Println("sent to", p.Server.ID)
		// The primary refuses connections: three successive connection
		// failures open its breaker (Config.Breaker.Threshold).
		p.Done(balancer.DoneInfo{Err: errors.New("connection refused"), ConnectFailure: true})
	}
	p, _ := b.Pick(ctx)
	fmt.Println("then to", p.Server.ID)
	p.Done(balancer.DoneInfo{})
	// Output:
	// sent to primary
	// sent to primary
	// sent to primary
	// then to replica
}

// A rule shared by every balancer of a factory, from any number of
// goroutines at once.
func TestCustomRuleThroughFactory(t *testing.T) {
	rule := &primaryFirst{}
	f, err := balancer.NewFactory(nil, balancer.WithBalancerOptions(balancer.WithRule(rule)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var wg sync.WaitGroup
	for _, name := range []string{"orders", "users"} {
		b, err := f.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		b.SetServers([]balancer.Server{
			{ID: name + "-1", Host: "10.0.0.1", Port: 80},
			{ID: name + "-p", Host: "10.0.0.2", Port: 80, Metadata: map[string]string{"role": "primary"}},
		})
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 100 {
					p, err := b.Pick(t.Context())
					if err != nil {
						t.Error(err)
						return
					}
					if p.Server.ID != name+"-p" {
						t.Errorf("%s: picked %s, want the primary", name, p.Server.ID)
					}
					p.Done(balancer.DoneInfo{})
				}
			}()
		}
	}
	wg.Wait()
	for _, name := range []string{"orders", "users"} {
		b, _ := f.Get(name)
		st := b.ServerStats(name + "-p")
		if st.Requests() != 400 || st.ActiveRequests() != 0 {
			t.Errorf("%s: %d requests, %d active; want 400, 0", name, st.Requests(), st.ActiveRequests())
		}
	}
}

// A rule that declines a zone's servers gets the whole list next; one that
// declines everything makes the pick fail with ErrNoServers.
func TestCustomRuleThatDeclines(t *testing.T) {
	b, err := balancer.New("svc", balancer.DefaultConfig(), balancer.WithRule(declineAll{}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.SetServers([]balancer.Server{{Host: "10.0.0.1", Port: 80}})
	if p, err := b.Pick(t.Context()); !errors.Is(err, balancer.ErrNoServers) || p.Server != nil {
		t.Fatalf("Pick = %v, %v; want ErrNoServers", p.Server, err)
	}
	p := balancer.Pick{} // the zero Pick of a failed pick does nothing
	p.Done(balancer.DoneInfo{})
	p.End()
}

type declineAll struct{}

func (declineAll) Choose(balancer.PickInfo) (*balancer.Server, error) { return nil, nil }
