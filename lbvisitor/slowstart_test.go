package lbvisitor

import (
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
)

// The record's incarnation reaches the balancer's server: an instance
// that restarted under the same ID (a new incarnation, no change of
// membership) starts its slow start again, with its statistics kept.
func TestVisitorIncarnationRestartsSlowStart(t *testing.T) {
	cfg := balancer.DefaultConfig()
	cfg.Rule = balancer.RuleRoundRobin
	cfg.SlowStart.Window = time.Minute
	b, err := balancer.New("orders", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	one, two := inst(1), inst(2)
	one.Incarnation, two.Incarnation = 1, 1
	res := &fixedResolver{}
	res.set(false, one, two)
	v := NewVisitor(b, res, VisitorConfig{})
	ctx := t.Context()
	if err := v.Apply(ctx, lc(1, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if s := b.Server(two.InstanceID); s.Incarnation != 1 {
		t.Fatalf("incarnation %d, want the record's 1", s.Incarnation)
	}
	if r := b.Ramping(); len(r) != 0 {
		t.Fatalf("the first list ramps: %v", r)
	}
	st := b.ServerStats(two.InstanceID)

	two.Incarnation = 2
	res.set(false, one, two)
	if err := v.Apply(ctx, lc(2, 1, 2)); err != nil {
		t.Fatal(err)
	}
	if r := b.Ramping(); len(r) != 1 || r[two.InstanceID] != 0.1 {
		t.Fatalf("ramping %v, want %s at 10 %%", r, two.InstanceID)
	}
	if b.ServerStats(two.InstanceID) != st {
		t.Fatal("the restarted instance's statistics were not kept")
	}
}
