package lbhttp

import (
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/pushlb/pushlb/balancer"
)

// DefaultHintHeader is the request header a route reads its hint from
// unless Hints.HintHeader names another ("-": none), as Spring Cloud
// LoadBalancer reads X-SC-LB-Hint.
const DefaultHintHeader = "X-Pushlb-Hint"

// noHintHeader is the HintHeader value that turns the hint header off.
const noHintHeader = "-"

// maxSplitWeight bounds a split's total weight, so that sums never
// overflow and a draw is one IntN.
const maxSplitWeight = 1 << 30

// Subsets send a route's requests to a subset of its service's instances,
// chosen by their metadata, as Envoy's subset load balancer does with a
// route's metadata_match and its weighted clusters do for canaries:
//
//	subset: version=v2             # every request to the v2 instances
//	split:                         # or: a share of the requests to each
//	  - {subset: version=v1, weight: 95}
//	  - {subset: version=v2, weight: 5}
//	fallback: none                 # any (default), default, none
//	defaultSubset: version=v1      # with fallback: default
//
// A split draws each request's subset at random in proportion to the
// weights, or, when the route takes a key (HashKey) and the request has
// one, from the key's hash: a key always gets the same subset (a user
// stays on the canary), and the shares hold over many keys. When no alive
// instance matches the subset, Fallback applies (see
// balancer.SubsetFallback): any instance, the default subset, or none, a
// 503 that names the selector. A request hint (HintHeader) comes first:
// when an instance has the hint, the request goes there; otherwise, to
// the route's subset.
type Subsets struct {
	// Subset is a selector, "key=value[,key=value...]" (balancer.ParseSelector).
	Subset string `yaml:"subset"`
	// Split shares the requests between subsets by weight; not with Subset.
	Split []SplitShare `yaml:"split"`
	// Fallback is what a request does when its subset has no alive
	// instance: "any" (the default), "default" (DefaultSubset), "none".
	Fallback string `yaml:"fallback"`
	// DefaultSubset is the selector of Fallback "default".
	DefaultSubset string `yaml:"defaultSubset"`
}

// SplitShare is one subset of a split and its weight, a relative share (0
// turns it off; the weights of a split must not all be 0).
type SplitShare struct {
	Subset string `yaml:"subset"`
	Weight int    `yaml:"weight"`
}

// IsZero reports whether s names no subset.
func (s Subsets) IsZero() bool {
	return s.Subset == "" && len(s.Split) == 0 && s.Fallback == "" && s.DefaultSubset == ""
}

// subsetPlan is a route's Subsets compiled: the balancer.Subset values
// its requests carry, built once.
type subsetPlan struct {
	one   *balancer.Subset   // Subset's, or nil
	split []*balancer.Subset // Split's, in order
	cum   []int              // cumulative weights of split
}

// compile checks s and builds its plan (nil when s names no subset).
// Errors name the key at fault: "split[1].weight: ...".
func (s Subsets) compile() (*subsetPlan, error) {
	if s.IsZero() {
		return nil, nil
	}
	fallback := balancer.SubsetFallback(s.Fallback)
	switch fallback {
	case "", balancer.FallbackAny, balancer.FallbackDefault, balancer.FallbackNone:
	default:
		return nil, hintError("fallback: %q is not one of any, default, none", s.Fallback)
	}
	if (fallback == balancer.FallbackDefault) != (s.DefaultSubset != "") {
		return nil, hintError("defaultSubset: set it with fallback: default, and only then")
	}
	var def balancer.Selector
	if s.DefaultSubset != "" {
		var err error
		if def, err = balancer.ParseSelector(s.DefaultSubset); err != nil {
			return nil, hintError("defaultSubset: %s", selectorError(err))
		}
	}
	subset := func(field, sel string) (*balancer.Subset, error) {
		sub := &balancer.Subset{Fallback: fallback, Default: def}
		var err error
		if sub.Selector, err = balancer.ParseSelector(sel); err != nil {
			return nil, hintError("%s: %s", field, selectorError(err))
		}
		if err := sub.Validate(); err != nil {
			return nil, hintError("%s: %s", field, selectorError(err))
		}
		return sub, nil
	}
	p := &subsetPlan{}
	switch {
	case s.Subset != "" && len(s.Split) > 0:
		return nil, hintError("subset and split: set one of them, not both")
	case s.Subset != "":
		var err error
		if p.one, err = subset("subset", s.Subset); err != nil {
			return nil, err
		}
	case len(s.Split) > 0:
		total := 0
		seen := map[string]bool{}
		for i, sh := range s.Split {
			sub, err := subset("split["+strconv.Itoa(i)+"].subset", sh.Subset)
			if err != nil {
				return nil, err
			}
			if seen[sub.String()] {
				return nil, hintError("split[%d].subset: %s appears twice", i, sub)
			}
			seen[sub.String()] = true
			if sh.Weight < 0 || sh.Weight > maxSplitWeight-total {
				return nil, hintError("split[%d].weight: %d out of range (0 or more, %d in all at most)", i, sh.Weight, maxSplitWeight)
			}
			total += sh.Weight
			p.split = append(p.split, sub)
			p.cum = append(p.cum, total)
		}
		if total == 0 {
			return nil, hintError("split: every weight is 0")
		}
	default:
		return nil, hintError("fallback, defaultSubset: set with subset or split")
	}
	return p, nil
}

// selectorError is err's message without the balancer's prefix: the
// field names say where it comes from.
func selectorError(err error) string {
	return strings.TrimPrefix(err.Error(), balancer.ErrInvalidConfig.Error()+": ")
}

// subsetFor returns the subset of one request: the route's, or the
// split's share drawn for it (from key's hash when key is not empty), or
// nil when the route names none.
func (p *subsetPlan) subsetFor(key string, env *subsetEnv) *balancer.Subset {
	if p == nil {
		return nil
	}
	if p.one != nil {
		return p.one
	}
	total := p.cum[len(p.cum)-1]
	var x int
	if key != "" {
		x = int(balancer.KeyHash(key) % uint64(total))
	} else if env != nil && env.rnd != nil {
		x = env.rnd.IntN(total)
	} else {
		x = rand.IntN(total)
	}
	for i, c := range p.cum {
		if x < c {
			return p.split[i]
		}
	}
	return p.split[len(p.split)-1] // unreachable: x < total
}

// subsetEnv is the Proxy's settings for subsets, shared by its routes.
type subsetEnv struct {
	observe func(service, subset string)
	rnd     balancer.Rand
}

// env returns the Proxy's subset settings, creating them.
func (p *Proxy) subsetEnv() *subsetEnv {
	if p.hints.env == nil {
		p.hints.env = &subsetEnv{}
	}
	return p.hints.env
}

// WithSubsetObserver sets a function told the subset of every request a
// route sends to one (Subsets: its Subset, or its split's share), with
// the service: for metrics of a canary's share. It is called on the
// request's goroutine, from many at once, and must be quick. Requests
// steered by a hint header alone are not reported (their values come from
// clients, not from the configuration).
func WithSubsetObserver(f func(service, subset string)) ProxyOption {
	return func(p *Proxy) error {
		if f == nil {
			return optionError("nil subset observer")
		}
		p.subsetEnv().observe = f
		return nil
	}
}

// WithSubsetRand sets the randomness of the splits' draws for requests
// without a key (default: math/rand/v2's); tests inject a seeded one. It
// must be safe for concurrent use.
func WithSubsetRand(r balancer.Rand) ProxyOption {
	return func(p *Proxy) error {
		if r == nil {
			return optionError("nil subset rand")
		}
		p.subsetEnv().rnd = r
		return nil
	}
}

// hintHeader returns the header to read the hint from, or "".
func (h *Hints) hintHeader() string {
	switch h.HintHeader {
	case "":
		return DefaultHintHeader
	case noHintHeader:
		return ""
	}
	return h.HintHeader
}
