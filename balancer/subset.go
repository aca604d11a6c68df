package balancer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Subsets route a request to the instances whose metadata match a
// selector, as Envoy's subset load balancer does, and hints are Spring
// Cloud LoadBalancer's: a request hint selects the instances whose
// metadata "hint" equals it, and all instances when none does.
//
// A subset is a Snapshot of its own over the parent's *Server values, so
// the statistics, the liveness and the circuit breaker of an instance are
// the same whether it is picked through a subset or not; the zone filter,
// the zone-aware choice and the rule are the balancer's, applied inside the
// subset. Subsets are built when the list changes (and, for a key set seen
// for the first time, by the first pick that asks for it), never scanned
// per request: a pick finds its subset with two map lookups.

// HintKey is the metadata key a request hint (WithHint) is compared with:
// an instance announced with -meta hint=canary serves the requests hinted
// "canary", as Spring Cloud LoadBalancer's hint metadata does.
const HintKey = "hint"

// maxSubsetKeySets bounds how many distinct key sets (a selector's keys:
// "version", "version,region", the hint's) a balancer indexes; a request
// naming more falls back as its subset's Fallback says. Routes configure a
// handful; only a library user building selectors from request data could
// reach it.
const maxSubsetKeySets = 32

// ErrNoSubset is matched by the error of a pick whose subset has no
// instance and whose fallback is none (or a default subset that has none
// either). The error matches ErrNoServers too, so that callers that only
// know "nothing to choose" (an HTTP 503) need nothing new.
var ErrNoSubset = errors.New("balancer: no instance matches the subset")

// Selector is a set of metadata pairs an instance must all carry to be in
// a subset: "version=v2", "version=v2,region=eu". The zero Selector selects
// nothing (it is "no subset"). Build one with ParseSelector. A Selector is
// immutable and may be shared.
type Selector struct {
	keys   string // the keys, sorted, joined by ","
	values string // their values in the same order, joined by "\x00"
	str    string // the canonical form, String's
	pairs  []selectorPair
}

type selectorPair struct{ key, value string }

// ParseSelector parses "key=value[,key=value...]". Keys must be distinct;
// keys and values are trimmed and must not be empty; a key may not contain
// '=' and neither may contain ','. Errors wrap ErrInvalidConfig.
func ParseSelector(s string) (Selector, error) {
	if strings.TrimSpace(s) == "" {
		return Selector{}, fmt.Errorf("%w: empty selector", ErrInvalidConfig)
	}
	var pairs []selectorPair
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return Selector{}, fmt.Errorf("%w: selector %q: want key=value[,key=value...], got %q", ErrInvalidConfig, s, strings.TrimSpace(part))
		}
		if strings.ContainsRune(v, 0) || strings.ContainsRune(k, 0) {
			return Selector{}, fmt.Errorf("%w: selector %q: NUL byte", ErrInvalidConfig, s)
		}
		pairs = append(pairs, selectorPair{k, v})
	}
	slices.SortFunc(pairs, func(a, b selectorPair) int { return strings.Compare(a.key, b.key) })
	for i := 1; i < len(pairs); i++ {
		if pairs[i].key == pairs[i-1].key {
			return Selector{}, fmt.Errorf("%w: selector %q: key %q twice", ErrInvalidConfig, s, pairs[i].key)
		}
	}
	return newSelector(pairs), nil
}

func newSelector(pairs []selectorPair) Selector {
	ks := make([]string, len(pairs))
	vs := make([]string, len(pairs))
	kvs := make([]string, len(pairs))
	for i, p := range pairs {
		ks[i], vs[i], kvs[i] = p.key, p.value, p.key+"="+p.value
	}
	return Selector{keys: strings.Join(ks, ","), values: strings.Join(vs, "\x00"), str: strings.Join(kvs, ","), pairs: pairs}
}

// IsZero reports whether s selects nothing (the zero Selector).
func (s Selector) IsZero() bool { return len(s.pairs) == 0 }

// String returns the canonical form, keys sorted: "region=eu,version=v2".
// It does not allocate.
func (s Selector) String() string { return s.str }

// Matches reports whether md carries every pair of s.
func (s Selector) Matches(md map[string]string) bool {
	for _, p := range s.pairs {
		if v, ok := md[p.key]; !ok || v != p.value {
			return false
		}
	}
	return true
}

// SubsetFallback says what a pick does when no alive instance matches its
// subset's selector: Envoy's fallback_policy.
type SubsetFallback string

const (
	// FallbackAny balances over every instance (Envoy's ANY_ENDPOINT),
	// the default ("" means it too).
	FallbackAny SubsetFallback = "any"
	// FallbackDefault balances over the default subset
	// (Subset.Default; Envoy's DEFAULT_SUBSET); when that has no alive
	// instance either, the pick fails as with FallbackNone.
	FallbackDefault SubsetFallback = "default"
	// FallbackNone fails the pick with an error matching ErrNoSubset (and
	// ErrNoServers): an HTTP 503 that names the selector (Envoy's
	// NO_FALLBACK).
	FallbackNone SubsetFallback = "none"
)

// Subset is which instances a request goes to: those matching Selector,
// or, when none is alive, what Fallback says. A route builds its Subset
// once and passes the same pointer with every request (WithSubset).
type Subset struct {
	// Selector is the metadata the instances must carry.
	Selector Selector
	// Fallback applies when no alive instance matches; "" means
	// FallbackAny.
	Fallback SubsetFallback
	// Default is FallbackDefault's subset; it must be set with it, and
	// only with it.
	Default Selector
}

// Validate reports a zero selector, an unknown fallback, or a default
// subset without FallbackDefault (or the reverse). Errors wrap
// ErrInvalidConfig and name the field (selector, fallback, default).
func (s *Subset) Validate() error {
	if s.Selector.IsZero() {
		return fmt.Errorf("%w: selector: empty", ErrInvalidConfig)
	}
	switch s.Fallback {
	case "", FallbackAny, FallbackNone:
		if !s.Default.IsZero() {
			return fmt.Errorf("%w: default: set only with fallback %q", ErrInvalidConfig, FallbackDefault)
		}
	case FallbackDefault:
		if s.Default.IsZero() {
			return fmt.Errorf("%w: default: fallback %q needs a default subset", ErrInvalidConfig, FallbackDefault)
		}
	default:
		return fmt.Errorf("%w: fallback: %q is not one of any, default, none", ErrInvalidConfig, s.Fallback)
	}
	return nil
}

// String describes the subset for logs and metrics: its selector.
func (s *Subset) String() string { return s.Selector.String() }

// NoSubsetError is the error of a pick whose subset (and default subset)
// has no alive instance under FallbackNone or FallbackDefault. It matches
// ErrNoSubset and ErrNoServers.
type NoSubsetError struct {
	// Subset is the subset asked for.
	Subset *Subset
}

func (e *NoSubsetError) Error() string {
	msg := "no instance matches " + e.Subset.Selector.String()
	if e.Subset.Fallback == FallbackDefault {
		msg += " nor the default subset " + e.Subset.Default.String()
	}
	return msg
}

// Is matches ErrNoServers as well as ErrNoSubset.
func (e *NoSubsetError) Is(target error) bool { return target == ErrNoServers || target == ErrNoSubset }

type subsetKeyType struct{}

// subsetChoice is a request's subset choice, one context value for both
// the hint and the subset so that a pick looks the context up once.
type subsetChoice struct {
	hint   string
	subset *Subset
}

// WithHint returns a context whose picks prefer the instances whose
// metadata HintKey ("hint") equals hint, and fall back to the choice they
// would make without it when none is alive (Spring Cloud LoadBalancer's
// hint semantics; with a subset (WithSubset) on ctx, that subset). An
// empty hint removes the hint.
func WithHint(ctx context.Context, hint string) context.Context {
	noteSubsets()
	c := subsetChoiceFrom(ctx)
	return context.WithValue(ctx, subsetKeyType{}, &subsetChoice{hint: hint, subset: c.subset})
}

// WithSubset returns a context whose picks choose among the instances of
// s (see Subset); nil removes it. s must not be modified afterwards; a
// hint (WithHint) on ctx still applies first.
func WithSubset(ctx context.Context, s *Subset) context.Context {
	noteSubsets()
	c := subsetChoiceFrom(ctx)
	return context.WithValue(ctx, subsetKeyType{}, &subsetChoice{hint: c.hint, subset: s})
}

// HintFrom returns the hint set by WithHint.
func HintFrom(ctx context.Context) (string, bool) {
	c := subsetChoiceFrom(ctx)
	return c.hint, c.hint != ""
}

// SubsetFrom returns the subset set by WithSubset, or nil.
func SubsetFrom(ctx context.Context) *Subset { return subsetChoiceFrom(ctx).subset }

var noChoice subsetChoice

// subsetsAsked turns true the first time a context is given a hint or a
// subset in the process. Until then no context carries one, so a pick
// skips the lookup, which walks the context's chain (long for an HTTP
// request's or an RPC's) and would cost more than the pick itself, as
// zonesForced does for WithZone.
var subsetsAsked atomic.Bool

func noteSubsets() {
	if !subsetsAsked.Load() {
		subsetsAsked.Store(true)
		choicesCarried.Store(true)
	}
}

func subsetChoiceFrom(ctx context.Context) *subsetChoice {
	if c, ok := ctx.Value(subsetKeyType{}).(*subsetChoice); ok {
		return c
	}
	return &noChoice
}

// subsets is a balancer's subset index and what builds it. The zero value
// is ready: a balancer whose picks never name a subset never builds one.
type subsets struct {
	mu        sync.Mutex // serialises builds; guards keySets and listening
	keySets   []string   // the key sets indexed (Selector.keys)
	listening bool       // a Listener rebuilds the index on list changes
	index     atomic.Pointer[subsetIndex]
}

// subsetIndex is every subset of the key sets indexed, over one parent
// snapshot: byKeys[keys][values] is the subset of the instances whose
// metadata have these values for these keys (only subsets with an alive
// instance are present).
type subsetIndex struct {
	parent *Snapshot
	byKeys map[string]map[string]*subsetView
}

// subsetView is one subset: a snapshot of its servers, with its own zone
// decision, kept fresh by the picks that use it (freshSubset).
type subsetView struct {
	snap *Snapshot
	// picked is set by the first pick from it: the next index prepares
	// the rule's indexes of this subset with it (subsetSnapshot).
	picked atomic.Bool
	// epoch is the breaker epoch (statsShared.epoch) its zone decision was
	// made at; busy lets one pick at a time remake it.
	epoch atomic.Uint64
	busy  atomic.Bool
}

// snapshotFor returns the snapshot a pick with ctx chooses from: the
// current one, or the subset the context's hint or subset selects. It
// fails only for a subset with FallbackNone or FallbackDefault that has no
// alive instance (a *NoSubsetError); the snapshot is then an empty one, for
// a caller that cannot return an error (PickInfo.Refresh).
func (b *Balancer) snapshotFor(ctx context.Context) (*Snapshot, error) {
	snap := b.snap.Load()
	if !subsetsAsked.Load() {
		return snap, nil // no context can carry a subset (noteSubsets)
	}
	c, ok := ctx.Value(subsetKeyType{}).(*subsetChoice)
	if !ok || (c.hint == "" && c.subset == nil) || len(snap.full.servers) == 0 {
		return snap, nil
	}
	if c.hint != "" {
		if v := b.subsetOf(snap, HintKey, c.hint); v != nil {
			return b.freshSubset(v), nil
		}
	}
	s := c.subset
	if s == nil || s.Selector.IsZero() {
		return snap, nil
	}
	if v := b.subsetOf(snap, s.Selector.keys, s.Selector.values); v != nil {
		return b.freshSubset(v), nil
	}
	switch s.Fallback {
	case FallbackNone:
	case FallbackDefault:
		if v := b.subsetOf(snap, s.Default.keys, s.Default.values); v != nil {
			return b.freshSubset(v), nil
		}
	default:
		return snap, nil
	}
	empty := buildSnapshot(snap.version, nil, nil)
	empty.replaced = snap.replaced
	empty.decision.Store(&zoneDecision{due: math.MaxInt64, scope: &empty.full, view: &empty.full})
	return empty, &NoSubsetError{Subset: s}
}

// subsetOf returns the subset of the instances whose metadata have values
// for keys, or nil when none of them is alive. It indexes keys first if
// they are new.
func (b *Balancer) subsetOf(snap *Snapshot, keys, values string) *subsetView {
	idx := b.subsets.index.Load()
	if idx == nil || idx.parent != snap {
		idx = b.buildSubsets("")
	}
	m, ok := idx.byKeys[keys]
	if !ok {
		if len(idx.byKeys) >= maxSubsetKeySets {
			return nil // not indexed, nor to be: no lock per pick
		}
		m = b.buildSubsets(keys).byKeys[keys]
	}
	return m[values]
}

// buildSubsets makes the index over the current snapshot unless it is
// already made, indexing newKeys as well when not empty, and returns it.
func (b *Balancer) buildSubsets(newKeys string) *subsetIndex {
	st := &b.subsets
	st.mu.Lock()
	prev := st.index.Load()
	listen := false
	if newKeys != "" && !slices.Contains(st.keySets, newKeys) && len(st.keySets) < maxSubsetKeySets {
		st.keySets = append(st.keySets, newKeys)
		st.index.Store(nil)
		listen, st.listening = !st.listening, true
	}
	snap := b.snap.Load()
	idx := st.index.Load()
	if idx == nil || idx.parent != snap {
		idx = b.indexSubsets(snap, st.keySets, prev)
		st.index.Store(idx)
	}
	st.mu.Unlock()
	if listen {
		// Rebuilt on every list change by the goroutine that made it, so
		// that picks find it made; a change of liveness alone (a ping, a
		// MarkServerDown) is rebuilt by the first pick after it.
		b.AddListener(func(_, _ []*Server) { b.buildSubsets("") })
	}
	return idx
}

// picked reports whether the subset of values for keys was picked from in
// idx (nil: no index).
func (idx *subsetIndex) picked(keys, values string) bool {
	if idx == nil {
		return false
	}
	v := idx.byKeys[keys][values]
	return v != nil && v.picked.Load()
}

// refreshSubsets rebuilds the subset index over the current snapshot if
// one was built: the slow-start refresher calls it after a refresh of the
// live weights, which calls no listener, so that subset picks find it made.
func (b *Balancer) refreshSubsets() {
	if b.subsets.index.Load() != nil {
		b.buildSubsets("")
	}
}

// indexSubsets groups the servers of snap by the values of each key set
// and builds a snapshot per group with an alive server: O(servers x key
// sets). The subsets picked from in prev, the index it replaces (nil:
// none), get the rule's indexes at once.
func (b *Balancer) indexSubsets(snap *Snapshot, keySets []string, prev *subsetIndex) *subsetIndex {
	idx := &subsetIndex{parent: snap, byKeys: make(map[string]map[string]*subsetView, len(keySets))}
	now := b.shared.nanotime()
	epoch := b.shared.epoch.Load()
	var vals []string
	for _, keys := range keySets {
		ks := strings.Split(keys, ",")
		groups := make(map[string][]*Server)
		for _, srv := range snap.all {
			vals = vals[:0]
			for _, k := range ks {
				v, ok := srv.Metadata[k]
				if !ok {
					break
				}
				vals = append(vals, v)
			}
			if len(vals) == len(ks) {
				key := strings.Join(vals, "\x00")
				groups[key] = append(groups[key], srv)
			}
		}
		m := make(map[string]*subsetView, len(groups))
		for values, list := range groups {
			if v := b.subsetSnapshot(snap, list, now, epoch, prev.picked(keys, values)); v != nil {
				m[values] = v
			}
		}
		idx.byKeys[keys] = m
	}
	return idx
}

// subsetSnapshot builds the subset of list, a part of parent's servers, or
// returns nil when none of them is alive. Its servers are parent's, so
// their statistics and breakers are shared; its zone decision is made with
// the balancer's filter and zone settings; the rule indexes it as a list
// change's snapshot when prepare (the subset was picked from in the index
// before), and otherwise on the first pick that needs them (as a zone's
// view): a subset no pick uses costs its servers' requests nothing. It is
// replaced together with parent (PickInfo.Changed).
//
// Its version is parent's: BestAvailable's trees of a subset are watched
// by their servers' statistics with those of parent (leastactive.go), so a
// request started or ended through the whole list or any subset updates
// every tree that holds its server, and a subset pick sees it at once.
func (b *Balancer) subsetSnapshot(parent *Snapshot, list []*Server, now int64, epoch uint64, prepare bool) *subsetView {
	// The parent's live weights (slow start), as of its last refresh: a
	// refresh makes a new parent, and so new subsets.
	var r *ramp
	if parent.ramp != nil {
		r = &ramp{factor: parent.ramp.factor, scale: parent.ramp.scale, due: math.MaxInt64}
	}
	s := buildSnapshot(parent.version, list, r)
	if len(s.full.servers) == 0 {
		return nil
	}
	s.tiers = b.loc.tiersOf(s, r)
	s.replaced = parent.replaced
	if prepare {
		prepareRule(b, b.rule, s)
	}
	s.decision.Store(b.decideZones(s, now))
	v := &subsetView{snap: s}
	v.epoch.Store(epoch)
	return v
}

// freshSubset returns v's snapshot after remaking its zone decision if a
// breaker tripped or reset since it was made, or it is due (load, a
// blackout's end): the parent's decision is remade by the statistics'
// hooks, a subset's by the picks that use it. The clock is read only when
// the decision may be due: a breaker is open, or an active count changed
// since the balancer's decision was last made (statsShared.zonesPending).
func (b *Balancer) freshSubset(v *subsetView) *Snapshot {
	if !v.picked.Load() {
		v.picked.Store(true) // written once, not per pick
	}
	s := v.snap
	d := s.decision.Load()
	epoch := b.shared.epoch.Load()
	if epoch == v.epoch.Load() && (d.due == math.MaxInt64 || !(d.clockCheck() || b.shared.zonesPending.Load())) {
		// As chooseZone: no clock read unless a breaker is open or load
		// changed since a decision was made.
		return s
	}
	now := b.shared.nanotime()
	if (epoch != v.epoch.Load() || now >= d.due) && v.busy.CompareAndSwap(false, true) {
		v.epoch.Store(epoch) // before deciding: a change meanwhile is seen next time
		s.decision.Store(b.decideZones(s, now))
		v.busy.Store(false)
	}
	return s
}

// WithSubsetHint is WithSubset and WithHint at once, in one context value:
// what a proxy that reads both from a request uses. A nil s and an empty
// hint set neither.
func WithSubsetHint(ctx context.Context, s *Subset, hint string) context.Context {
	noteSubsets()
	return context.WithValue(ctx, subsetKeyType{}, &subsetChoice{hint: hint, subset: s})
}

// ReachableServersFor returns the alive servers a pick with ctx chooses
// among: ReachableServers, or those of the subset ctx's hint or subset
// selects (nil when a subset without fallback has none), for a fail-over
// outside the rule that must stay within the request's subset. Do not
// modify the slice.
func (b *Balancer) ReachableServersFor(ctx context.Context) []*Server {
	snap, err := b.snapshotFor(ctx)
	if err != nil {
		return nil
	}
	return snap.full.servers
}
