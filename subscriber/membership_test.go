package subscriber

import (
	"slices"
	"testing"
	"time"
)

func TestMembershipOrdering(t *testing.T) {
	type step struct {
		inc    int64
		online bool
		src    source
		want   outcome
		live   bool
	}
	ev, reg, gos := fromEvent, fromRegistry, fromGossip
	for name, steps := range map[string][]step{
		"online, duplicate, offline": {
			{1, true, ev, applied, true}, {1, true, ev, duplicate, true}, {1, false, ev, applied, false}, {1, false, ev, duplicate, false},
		},
		"late online of same incarnation is stale": {
			{1, true, ev, applied, true}, {1, false, ev, applied, false}, {1, true, ev, stale, false}, {1, true, reg, stale, false},
		},
		"offline before online (reordered)": {
			{1, false, ev, unchanged, false}, {1, true, ev, stale, false},
		},
		"restart then delayed offline of the old incarnation": {
			{1, true, ev, applied, true}, {2, true, ev, applied, true}, {1, false, ev, stale, true},
		},
		"restart reported before the old offline": {
			{1, true, ev, applied, true}, {1, false, ev, applied, false}, {2, true, ev, applied, true},
		},
		"registry loss is revived by the registry": {
			{1, true, ev, applied, true}, {1, false, reg, applied, false}, {1, true, ev, stale, false}, {1, true, reg, applied, true},
		},
		"gossip dead, refuted": {
			{1, true, ev, applied, true}, {1, false, gos, applied, false}, {1, true, reg, stale, false}, {1, true, ev, stale, false}, {1, true, gos, applied, true},
		},
		"late gossip dead of an old incarnation": {
			{1, true, ev, applied, true}, {2, true, ev, applied, true}, {1, false, gos, stale, true},
		},
		"gossip dead then restart": {
			{1, true, ev, applied, true}, {1, false, gos, applied, false}, {2, true, ev, applied, true},
		},
		"gossip alone does not add, nor block the announcement": {
			{1, true, gos, unchanged, false}, {1, true, ev, applied, true},
		},
		"gossip alive of a newer incarnation waits for its announcement": {
			{1, true, ev, applied, true}, {2, true, gos, unchanged, true}, {1, false, ev, applied, false}, {2, true, ev, applied, true},
		},
		"gossip alive does not undo an announced offline": {
			{1, true, ev, applied, true}, {1, false, ev, applied, false}, {1, true, gos, stale, false},
		},
		"newer offline for unknown-live": {
			{1, true, reg, applied, true}, {3, false, ev, applied, false}, {2, true, ev, stale, false}, {3, true, reg, stale, false},
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := newMembership()
			for i, s := range steps {
				if got := m.apply("svc", "i-1", s.inc, s.online, s.src, time.Now()); got != s.want {
					t.Fatalf("step %d: outcome %v, want %v", i, got, s.want)
				}
				if live := slices.Contains(m.live("svc"), "i-1"); live != s.live {
					t.Fatalf("step %d: live %v, want %v", i, live, s.live)
				}
			}
		})
	}
}

func TestMembershipRegistryAndCollect(t *testing.T) {
	m := newMembership()
	now := time.Now()
	if !m.addRegistered("svc", map[string]int64{"a": 1, "b": 1}, now) {
		t.Fatal("registering two instances is a change")
	}
	m.apply("svc", "c", 5, true, fromEvent, now)
	absent := m.liveAbsent("svc", map[string]int64{"a": 1})
	if len(absent) != 2 || absent["b"] != 1 || absent["c"] != 5 {
		t.Fatalf("absent %v", absent)
	}
	m.apply("svc", "b", 1, false, fromEvent, now)
	m.collect(now.Add(time.Second))
	if _, ok := m.services["svc"]["b"]; ok {
		t.Fatal("old tombstone not collected")
	}
	if got := m.live("svc"); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("live %v", got)
	}
}
