package gossip

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// memberlist's Shutdown does not wait for a probe in flight; it ends
	// within the probe's TCP timeout on its own.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// testLogger discards unless GOSSIP_TEST_LOG is set, as memberlist goroutines
// may still log for a moment after a test ends.
func testLogger() zerolog.Logger {
	if os.Getenv("GOSSIP_TEST_LOG") == "" {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Logger()
}

func gatewayMeta() Meta { return Meta{Role: RoleGateway} }

func instanceMeta(service, id string, incarnation int64) Meta {
	return Meta{Role: RoleInstance, Service: service, InstanceID: id, Incarnation: incarnation}
}

// fastConfig is a loopback node on a random port with the fast profile and a
// quick join retry.
func fastConfig(meta Meta, join ...string) Config {
	return Config{
		BindAddr:  "127.0.0.1:0",
		Join:      join,
		Profile:   ProfileFast,
		Meta:      meta,
		JoinRetry: JoinRetry{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:    testLogger(),
	}
}

// record is one Handler call as seen by a recorder.
type record struct {
	at     time.Time
	gone   bool
	member Member
	reason Reason
}

// recorder is a Handler that keeps every call and lets tests wait for one.
type recorder struct {
	mu      sync.Mutex
	records []record
	changed chan struct{} // closed and replaced on every record
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) add(rec record) {
	r.mu.Lock()
	r.records = append(r.records, rec)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder) NodeAlive(m Member) { r.add(record{at: time.Now(), member: m}) }

func (r *recorder) NodeGone(m Member, reason Reason) {
	r.add(record{at: time.Now(), gone: true, member: m, reason: reason})
}

func (r *recorder) snapshot() ([]record, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.records...), r.changed
}

// wait returns the first record matching match, waiting until ctx ends.
func (r *recorder) wait(ctx context.Context, match func(record) bool) (record, error) {
	for {
		recs, changed := r.snapshot()
		for _, rec := range recs {
			if match(rec) {
				return rec, nil
			}
		}
		select {
		case <-ctx.Done():
			return record{}, fmt.Errorf("no matching record among %d: %w", len(recs), ctx.Err())
		case <-changed:
		}
	}
}

func aliveNamed(name string) func(record) bool {
	return func(r record) bool { return !r.gone && r.member.Name == name }
}

func goneNamed(name string) func(record) bool {
	return func(r record) bool { return r.gone && r.member.Name == name }
}

// start builds and starts a node; on failure it closes what it built.
func start(ctx context.Context, cfg Config, h Handler) (*Node, error) {
	n, err := New(cfg, h)
	if err != nil {
		return nil, err
	}
	if err := n.Start(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// startNode starts a node that the test closes at its end.
func startNode(t testing.TB, cfg Config, h Handler) *Node {
	t.Helper()
	n, err := start(context.Background(), cfg, h)
	if err != nil {
		t.Fatalf("start(%s): %v", cfg.Meta.Role, err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close(%s): %v", cfg.Meta.Role, err)
		}
	})
	return n
}

// waitMembers waits until every node sees want members.
func waitMembers(ctx context.Context, want int, nodes ...*Node) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := true
		for _, n := range nodes {
			if n.NumMembers() != want {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			counts := make([]int, len(nodes))
			for i, n := range nodes {
				counts[i] = n.NumMembers()
			}
			return fmt.Errorf("members %v, want %d everywhere: %w", counts, want, ctx.Err())
		case <-tick.C:
		}
	}
}
