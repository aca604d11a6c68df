package balancer

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A Rule picks one server for one request from what the balancer hands
// it (see PickInfo): the candidates after the zone choice, the caller's
// context, the randomness and the clock. A rule needs nothing else, so it
// may live in any package; plug it in with WithRule.
//
// Threading: Choose runs on the caller's goroutine, for every pick,
// concurrently from any number of goroutines, with no lock held, and
// concurrently with list changes (each pick sees one immutable snapshot).
// It must be safe for concurrent use: state kept across picks (a
// round-robin position) must be atomic or otherwise synchronised. It must
// not modify the views or their servers, and should neither block nor
// allocate, as it sits on every request's path; a rule that waits by
// design (Retry) must honour p.Ctx. One rule value may serve several
// balancers (WithBalancerOptions(WithRule(r)) shares it).
//
// Choose returns a server of p.View or p.Candidates. It returns nil and no
// error when nothing suits it: when p.View was a zone, the balancer asks
// once more with every alive server as the view, then returns
// ErrNoServers. An error is returned to the caller as is.
type Rule interface {
	Choose(p PickInfo) (*Server, error)
}

// zoneAvoider is implemented by the rules that want the balancer's
// available-zone computation (ZoneAvoidance: Ribbon's zone predicate), even
// when Config.ZoneAware is off.
type zoneAvoider interface{ avoidsZones() bool }

func avoidsZones(r Rule) bool {
	z, ok := r.(zoneAvoider)
	return ok && z.avoidsZones()
}

// preparer is implemented by the rules that index a snapshot (BestAvailable's
// tree of active counts, Maglev's table): the balancer calls prepare with
// each new snapshot before installing it, with its list lock held, so picks
// find the index built.
type preparer interface {
	prepare(b *Balancer, s *Snapshot)
}

// prepareRule lets r index s, if it does.
func prepareRule(b *Balancer, r Rule, s *Snapshot) {
	if p, ok := r.(preparer); ok {
		p.prepare(b, s)
	}
}

// counter is a round-robin position. It starts at a random index so that
// many gateways do not all begin with the same server.
type counter struct{ n atomic.Uint64 }

func newCounter() *counter {
	c := &counter{}
	c.n.Store(rand.Uint64() >> 1)
	return c
}

func (c *counter) next(n int) int { return int(c.n.Add(1) % uint64(n)) }

// roundRobin returns the next server of list, or nil when it is empty.
func (c *counter) roundRobin(list []*Server) *Server {
	if len(list) == 0 {
		return nil
	}
	return list[c.next(len(list))]
}

// roundRobinView returns the next server of v, in proportion to the
// weights when they differ (weights.go), or nil when v is empty.
func (c *counter) roundRobinView(v *View) *Server {
	if len(v.servers) == 0 {
		return nil
	}
	return v.at(c.n.Add(1))
}

// roundRobinTries is how many round-robin positions a predicate rule tries
// before scanning the whole list (Ribbon's AvailabilityFilteringRule: 10).
const roundRobinTries = 10

// roundRobinWhere returns the next server of list that passes p: it tries
// up to roundRobinTries round-robin positions, then picks round robin among
// all the servers that pass. It returns nil when none does.
func (c *counter) roundRobinWhere(list []*Server, p availability, now int64) *Server {
	pi := PickInfo{now: now, hasNow: true}
	return c.roundRobinAvailable(listView(list), p, &pi)
}

// roundRobinAvailable is roundRobinWhere over v at the pick's time, read
// only if a server's state needs it. The tries follow v's weights; the
// scan after them does not.
func (c *counter) roundRobinAvailable(v *View, p availability, pi *PickInfo) *Server {
	list := v.servers
	n := len(list)
	if n == 0 {
		return nil
	}
	if p.allPass(pi) {
		return v.at(c.n.Add(1)) // what the first try would take
	}
	for range min(n, roundRobinTries) {
		if s := v.at(c.n.Add(1)); p.ok(s, pi) {
			return s
		}
	}
	eligible := 0
	for _, s := range list {
		if p.ok(s, pi) {
			eligible++
		}
	}
	if eligible == 0 {
		return nil
	}
	k := c.next(eligible)
	for _, s := range list {
		if p.ok(s, pi) {
			if k == 0 {
				return s
			}
			k--
		}
	}
	return nil
}

// availability is Ribbon's AvailabilityPredicate: a server passes unless
// its circuit breaker is open or it has limit or more active requests.
type availability struct {
	limit int64 // 0: no limit
	// ejectedOnly passes every server that outlier detection has not
	// ejected, tripped or not (skipEjected, for the rules that ignore the
	// breaker).
	ejectedOnly bool
}

// allPass reports that every server passes at the pick pi without reading
// any: no limit, and no server of the balancer tripped or ejected
// (statsShared.noneUnavailable).
func (p availability) allPass(pi *PickInfo) bool {
	return p.limit == 0 && !p.ejectedOnly && pi.b != nil && (pi.b.shared.quiet() || pi.b.shared.noneUnavailableNow(pi))
}

func (p availability) ok(s *Server, pi *PickInfo) bool {
	if p.ejectedOnly {
		return !s.inst.view().ejectedAt(pi.nanotime())
	}
	if pi.Tripped(s) {
		return false
	}
	return p.limit == 0 || s.inst.view().activeAt(pi.nanotime()) < p.limit
}

// RoundRobin cycles through the alive servers (Ribbon's RoundRobinRule). It
// ignores the circuit breaker. When weights differ it is weighted round
// robin: over any window of picks each server gets its weight's share, give
// or take a pick or two, interleaved with the others (weights.go).
type RoundRobin struct{ c *counter }

// NewRoundRobin returns a RoundRobin rule.
func NewRoundRobin() *RoundRobin { return &RoundRobin{c: newCounter()} }

// Choose implements Rule.
func (r *RoundRobin) Choose(p PickInfo) (*Server, error) {
	return r.c.roundRobinView(p.View), nil
}

// Random picks an alive server at random (Ribbon's RandomRule): uniformly,
// or in proportion to the weights when they differ.
type Random struct{}

// Choose implements Rule.
func (Random) Choose(p PickInfo) (*Server, error) {
	list := p.View.servers
	if len(list) == 0 {
		return nil, nil
	}
	if p.View.sweep != nil {
		return p.View.weightedRandom(p.Rand()), nil
	}
	return list[intN(p.Rand(), len(list))], nil
}

// BestAvailable picks the server with the fewest active requests among
// those whose breaker is closed (when weights differ: the fewest active
// requests per weight), at random among equals, falling back to
// round robin when every breaker is open (Ribbon's BestAvailableRule, whose
// ties go to the first server: an idle list would send every request to
// one). It is exact: the least-loaded server as of the pick.
//
// A pick costs O(log N) without a lock: each view's servers are indexed in
// a tree of active counts (leastactive.go), built with the snapshot and
// kept current by every request's start and end, which pay O(log N) atomic
// word updates for it (about 2 x 60 ns at 10,000 servers; other rules pay
// one atomic load). Use LeastRequest, O(1) on both paths, when near-least is
// enough: many gateways, or servers whose counts move faster than picks
// can follow.
type BestAvailable struct {
	c  *counter
	mu sync.Mutex // serialises lazy tree builds (zone views)
}

// NewBestAvailable returns a BestAvailable rule.
func NewBestAvailable() *BestAvailable { return &BestAvailable{c: newCounter()} }

// Choose implements Rule.
func (r *BestAvailable) Choose(p PickInfo) (*Server, error) {
	if len(p.View.servers) == 0 {
		return nil, nil
	}
	if t := r.activeTreeOf(&p); t != nil {
		if s := t.least(&p); s != nil {
			return s, nil
		}
		return r.c.roundRobin(p.View.servers), nil
	}
	return r.scan(&p), nil
}

// scan is Choose over a hand-made PickInfo, whose view has no tree: a pass
// over the servers, ties drawn by reservoir sampling.
func (r *BestAvailable) scan(p *PickInfo) *Server {
	var best *Server
	bestActive, ties := int64(-1), 0
	for _, s := range p.View.servers {
		if p.Tripped(s) {
			continue
		}
		switch a := p.ActiveRequests(s); {
		case best == nil || a < bestActive:
			best, bestActive, ties = s, a, 1
		case a == bestActive:
			if ties++; p.Rand().IntN(ties) == 0 {
				best = s
			}
		}
	}
	if best == nil {
		best = r.c.roundRobin(p.View.servers)
	}
	return best
}

// prepare builds the tree of a new snapshot's full view.
func (r *BestAvailable) prepare(b *Balancer, s *Snapshot) {
	if len(s.full.servers) > 0 {
		s.full.least.Store(newActiveTree(&s.full, b.shared, b.shared.nanotime()))
	}
}

// AvailabilityFiltering picks round robin, skipping servers whose breaker is
// open or that have ActiveConnectionsLimit active requests; when none
// passes it falls back to plain round robin (Ribbon's
// AvailabilityFilteringRule).
type AvailabilityFiltering struct {
	c    *counter
	pred availability
}

// NewAvailabilityFiltering returns the rule; limit 0 means no limit on
// active requests.
func NewAvailabilityFiltering(limit int) *AvailabilityFiltering {
	return &AvailabilityFiltering{c: newCounter(), pred: availability{limit: int64(limit)}}
}

// Choose implements Rule.
func (r *AvailabilityFiltering) Choose(p PickInfo) (*Server, error) {
	if s := r.c.roundRobinAvailable(p.View, r.pred, &p); s != nil {
		return s, nil
	}
	return r.c.roundRobinView(p.View), nil
}

// ZoneAvoidance is Spring Cloud's default rule (Ribbon's ZoneAvoidanceRule):
// a server must be in an available zone (see the package doc) and pass the
// availability predicate; failing that, the availability predicate alone;
// failing that, any server. It asks the balancer to draw one available
// zone on every pick, at random weighted by instance count (whether or not
// Config.ZoneAware is on), then picks round robin within the zone, so a
// pick costs O(zones), not O(servers).
type ZoneAvoidance struct {
	c    *counter
	pred availability
}

// NewZoneAvoidance returns the rule; limit as for AvailabilityFiltering.
func NewZoneAvoidance(limit int) *ZoneAvoidance {
	return &ZoneAvoidance{c: newCounter(), pred: availability{limit: int64(limit)}}
}

// Choose implements Rule.
func (r *ZoneAvoidance) Choose(p PickInfo) (*Server, error) {
	if len(p.View.servers) == 0 {
		return nil, nil
	}
	return r.choose(&p), nil
}

// choose is Choose over a view that has servers, with p by reference: the
// balancer calls it directly.
func (r *ZoneAvoidance) choose(p *PickInfo) *Server {
	if s := r.c.roundRobinAvailable(p.View, r.pred, p); s != nil {
		return s
	}
	if p.Candidates != p.View {
		if s := r.c.roundRobinAvailable(p.Candidates, r.pred, p); s != nil {
			return s
		}
	}
	return r.c.roundRobinView(p.View)
}

func (*ZoneAvoidance) avoidsZones() bool { return true }

// WeightedResponseTime picks servers with a probability that falls as their
// average response time rises (Ribbon's WeightedResponseTimeRule): with
// total the sum of the averages, server i weighs total - avg_i. Weights are
// rebuilt per view at most every interval, by the pick that finds them
// stale; without response-time data it is round robin. A list change builds
// a new view, so weights never index past the current list.
type WeightedResponseTime struct {
	c        *counter
	interval time.Duration
}

// NewWeightedResponseTime returns the rule; interval is Ribbon's 30 s
// weight-refresh period.
func NewWeightedResponseTime(interval time.Duration) *WeightedResponseTime {
	return &WeightedResponseTime{c: newCounter(), interval: interval}
}

// responseWeights are cumulative weights over a view's servers.
type responseWeights struct {
	cum []float64 // nil: not enough data, use round robin
	at  int64
}

// Choose implements Rule.
func (r *WeightedResponseTime) Choose(p PickInfo) (*Server, error) {
	v := p.View
	if len(v.servers) == 0 {
		return nil, nil
	}
	w := r.weights(v, p.nanotime())
	if w.cum == nil {
		return r.c.roundRobinView(v), nil // weighted, and slowed, as RoundRobin
	}
	last := w.cum[len(w.cum)-1]
	x := p.Rand().Float64() * last
	i := sort.SearchFloat64s(w.cum, x) // first cumulative weight >= x
	return v.servers[min(i, len(v.servers)-1)], nil
}

func (r *WeightedResponseTime) weights(v *View, now int64) *responseWeights {
	w := v.weights.Load()
	if w != nil && now-w.at < int64(r.interval) && now >= w.at {
		return w
	}
	var rmp *ramp
	if v.snap != nil {
		rmp = v.snap.ramp
	}
	w = buildWeights(v.servers, now, rmp)
	v.weights.Store(w)
	return w
}

// buildWeights computes Ribbon's cumulative weights: e.g. averages 10, 40,
// 80, 100 ms give 220, 410, 560, 690. A server in slow start (r) has its
// weight scaled by its ramp's factor (slowstart.go).
func buildWeights(servers []*Server, now int64, r *ramp) *responseWeights {
	w := &responseWeights{at: now}
	total := 0.0
	avgs := make([]float64, len(servers))
	for i, s := range servers {
		if rt, ok := s.inst.view().ResponseTime(); ok {
			avgs[i] = float64(rt)
			total += avgs[i]
		}
	}
	cum := make([]float64, len(servers))
	acc := 0.0
	for i, s := range servers {
		acc += (total - avgs[i]) * r.factorOf(s)
		cum[i] = acc
	}
	if acc < 0.001 {
		return w
	}
	w.cum = cum
	return w
}

// Retry wraps another rule and re-chooses until it yields an alive server
// or the timeout (Ribbon's RetryRule, 500 ms) passes, honouring the pick's
// context. It does not spin: between attempts it waits for the next list
// change (PickInfo.Changed) or a short, growing backoff, then re-chooses
// over the current list (PickInfo.Refresh). The timeout is real time, not
// the balancer's clock: it bounds a real wait.
type Retry struct {
	Sub     Rule
	Timeout time.Duration
}

// Choose implements Rule.
func (r *Retry) Choose(p PickInfo) (*Server, error) {
	// The common case first, without reading the clock or arming a timer.
	if s, err := r.Sub.Choose(p); err != nil || (s != nil && s.Alive()) {
		return s, err
	}
	return r.retry(p)
}

// retry is Choose after a failed first pick, kept apart so that the common
// case stays a small function.
func (r *Retry) retry(p PickInfo) (*Server, error) {
	ctx := p.Ctx
	deadline := time.Now().Add(r.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	backoff := time.Millisecond
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		s, err := r.Sub.Choose(p)
		if err != nil {
			return nil, err
		}
		if s != nil && s.Alive() {
			return s, nil
		}
		wait := min(backoff, time.Until(deadline))
		if wait <= 0 {
			return nil, nil
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.Changed():
		case <-timer.C:
		}
		backoff = min(2*backoff, 50*time.Millisecond)
		p = p.Refresh()
	}
}

func (r *Retry) avoidsZones() bool { return avoidsZones(r.Sub) }

func (r *Retry) prepare(b *Balancer, s *Snapshot) { prepareRule(b, r.Sub, s) }

// Rendezvous sends equal keys (WithKey) to the same server with rendezvous
// (highest random weight) hashing, so a list change moves only the keys of
// the servers that came or went. Servers whose breaker is open are skipped
// while another is available. Without a key it is round robin. It scans
// the view: O(servers) per keyed pick.
//
// The rule named "Rendezvous" in a Config is Maglev since issue 11 (O(1)
// per pick, a table built per list change, a few more keys moved when a
// server leaves); this type remains for WithRule, for a small list that
// wants the minimal movement.
type Rendezvous struct{ c *counter }

// NewRendezvous returns a Rendezvous rule.
func NewRendezvous() *Rendezvous { return &Rendezvous{c: newCounter()} }

// Choose implements Rule.
func (r *Rendezvous) Choose(p PickInfo) (*Server, error) {
	key, ok := p.Key()
	if !ok {
		return r.c.roundRobin(p.View.servers), nil
	}
	now := p.nanotime()
	kh := fnv64(key)
	var best, bestAny *Server
	var bestScore, bestAnyScore uint64
	for _, s := range p.View.servers {
		score := mix64(kh ^ fnv64(s.ID))
		if bestAny == nil || score > bestAnyScore {
			bestAny, bestAnyScore = s, score
		}
		if !s.inst.view().trippedAt(now) && (best == nil || score > bestScore) {
			best, bestScore = s, score
		}
	}
	if best == nil {
		best = bestAny
	}
	return best, nil
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is splitmix64's finaliser: it spreads the combined hashes.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// NewRule builds the named rule for cfg. Names are those of the Rule
// constants, case-insensitive, with or without a "Rule" suffix, or Ribbon's
// class names.
func NewRule(name string, cfg *Config) (Rule, error) {
	canon, err := canonicalRule(name)
	if err != nil {
		return nil, err
	}
	switch canon {
	case RuleRoundRobin:
		return NewRoundRobin(), nil
	case RuleRandom:
		return Random{}, nil
	case RuleWeightedResponseTime:
		return NewWeightedResponseTime(cfg.WeightsInterval), nil
	case RuleBestAvailable:
		return NewBestAvailable(), nil
	case RuleAvailabilityFiltering:
		return NewAvailabilityFiltering(cfg.ActiveConnectionsLimit), nil
	case RuleZoneAvoidance:
		return NewZoneAvoidance(cfg.ActiveConnectionsLimit), nil
	case RuleRendezvous, RuleMaglev:
		return NewMaglev(), nil
	case RuleLeastRequest:
		return NewLeastRequest(), nil
	case RuleRetry:
		subName, err := canonicalRule(cfg.RetrySubRule)
		if err != nil {
			return nil, err
		}
		if subName == RuleRetry {
			return nil, fmt.Errorf("%w: retrySubRule: Retry cannot wrap itself", ErrInvalidConfig)
		}
		sub, err := NewRule(subName, cfg)
		if err != nil {
			return nil, err
		}
		return &Retry{Sub: sub, Timeout: cfg.RetryTimeout}, nil
	}
	return nil, fmt.Errorf("%w: unknown rule %q", ErrInvalidConfig, name)
}

// ribbonRules maps Ribbon's rule class names (lower case) to pushlb's.
var ribbonRules = map[string]string{
	"com.netflix.loadbalancer.roundrobinrule":            RuleRoundRobin,
	"com.netflix.loadbalancer.randomrule":                RuleRandom,
	"com.netflix.loadbalancer.weightedresponsetimerule":  RuleWeightedResponseTime,
	"com.netflix.loadbalancer.responsetimeweightedrule":  RuleWeightedResponseTime,
	"com.netflix.loadbalancer.bestavailablerule":         RuleBestAvailable,
	"com.netflix.loadbalancer.availabilityfilteringrule": RuleAvailabilityFiltering,
	"com.netflix.loadbalancer.zoneavoidancerule":         RuleZoneAvoidance,
	"com.netflix.loadbalancer.retryrule":                 RuleRetry,
}

var ruleNames = []string{RuleRoundRobin, RuleRandom, RuleWeightedResponseTime, RuleBestAvailable,
	RuleAvailabilityFiltering, RuleZoneAvoidance, RuleRetry, RuleRendezvous, RuleLeastRequest, RuleMaglev}

func canonicalRule(name string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if r, ok := ribbonRules[n]; ok {
		return r, nil
	}
	n = strings.TrimSuffix(n, "rule")
	for _, r := range ruleNames {
		if strings.ToLower(r) == n {
			return r, nil
		}
	}
	return "", fmt.Errorf("%w: unknown rule %q (want one of %s, or a Ribbon rule class name)",
		ErrInvalidConfig, name, strings.Join(ruleNames, ", "))
}

// ribbonFilters maps Ribbon's and Spring's filter class names (lower case).
var ribbonFilters = map[string]string{
	"com.netflix.loadbalancer.zoneaffinityserverlistfilter":                   FilterZoneAffinity,
	"com.netflix.niws.loadbalancer.defaultniwsserverlistfilter":               FilterNone,
	"org.springframework.cloud.netflix.ribbon.zonepreferenceserverlistfilter": FilterZonePreference,
}

var filterNames = []string{FilterNone, FilterZoneAffinity, FilterZonePreference}

func canonicalFilter(name string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if f, ok := ribbonFilters[n]; ok {
		return f, nil
	}
	n = strings.TrimSuffix(strings.TrimSuffix(n, "filter"), "serverlist")
	for _, f := range filterNames {
		if strings.ToLower(f) == n {
			return f, nil
		}
	}
	return "", fmt.Errorf("%w: unknown filter %q (want one of %s, or a Ribbon filter class name)",
		ErrInvalidConfig, name, strings.Join(filterNames, ", "))
}

var (
	_ Rule = (*RoundRobin)(nil)
	_ Rule = Random{}
	_ Rule = (*BestAvailable)(nil)
	_ Rule = (*AvailabilityFiltering)(nil)
	_ Rule = (*ZoneAvoidance)(nil)
	_ Rule = (*WeightedResponseTime)(nil)
	_ Rule = (*Retry)(nil)
	_ Rule = (*Rendezvous)(nil)

	_ zoneAvoider = (*ZoneAvoidance)(nil)
	_ zoneAvoider = (*Retry)(nil)

	_ preparer = (*BestAvailable)(nil)
	_ preparer = (*Maglev)(nil)
	_ preparer = (*Retry)(nil)
)
