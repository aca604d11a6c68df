package convergence

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
)

// Defaults of ViewerConfig.
const (
	// DefaultMaxGateways bounds the gateways a Viewer keeps.
	DefaultMaxGateways = 1000
	// DefaultStale is how long a gateway may go without a report before
	// a Viewer calls it stale.
	DefaultStale = 30 * time.Second
)

// ViewerConfig configures a Viewer.
type ViewerConfig struct {
	// Prefix is the subject prefix (events.DefaultPrefix when empty).
	Prefix string
	// MaxGateways bounds the gateways kept; reports of more are dropped
	// (counted). Zero means DefaultMaxGateways (1,000).
	MaxGateways int
	// Stale is how long a gateway may go without a report before it is
	// listed stale, and no longer counted behind; one silent for three
	// times as long is forgotten. Zero means DefaultStale (30 s); it
	// should be well above the reporters' 10 intervals.
	Stale time.Duration
	// Logger receives dropped reports (sampled).
	Logger zerolog.Logger
}

// Viewer follows every gateway's reports and tells, per service, which
// gateways are behind. Build it with NewViewer, run it with Start, stop it
// with Close; View and Stats are safe for concurrent use.
type Viewer struct {
	nc  *nats.Conn
	cfg ViewerConfig
	log zerolog.Logger
	now func() time.Time

	mu       sync.Mutex
	sub      *nats.Subscription
	gateways map[string]*gatewayState
	services map[string]*target

	received, dropped, refused atomic.Uint64
}

type gatewayState struct {
	report   Report
	received time.Time
}

// target is the newest revision of a service any gateway applied, and
// when the Viewer first heard of it.
type target struct {
	revision uint64
	digest   string
	since    time.Time // when digest was first reported with the newest revision
}

// lacks reports whether a gateway that applied a lacks the target's list:
// an older revision and another list. A gateway whose revision is older
// but whose list is the same only missed lease refreshes.
func (t *target) lacks(a Applied) bool {
	if a.Revision >= t.revision {
		return false
	}
	return a.Digest == "" || t.digest == "" || a.Digest != t.digest
}

// NewViewer checks cfg and returns a Viewer over nc. It subscribes to
// nothing until Start.
func NewViewer(nc *nats.Conn, cfg ViewerConfig) (*Viewer, error) {
	if nc == nil {
		return nil, errors.New("convergence: viewer: nil connection")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = events.DefaultPrefix
	}
	if err := events.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("convergence: viewer: %w", err)
	}
	if cfg.MaxGateways <= 0 {
		cfg.MaxGateways = DefaultMaxGateways
	}
	if cfg.Stale <= 0 {
		cfg.Stale = DefaultStale
	}
	return &Viewer{
		nc: nc, cfg: cfg, now: time.Now,
		log:      cfg.Logger.Sample(&zerolog.BurstSampler{Burst: 5, Period: time.Minute}),
		gateways: make(map[string]*gatewayState), services: make(map[string]*target),
	}, nil
}

// Start subscribes to every gateway's reports.
func (v *Viewer) Start() error {
	sub, err := v.nc.Subscribe(WildcardSubject(v.cfg.Prefix), v.onReport)
	if err != nil {
		return fmt.Errorf("convergence: viewer: subscribe: %w", err)
	}
	v.mu.Lock()
	v.sub = sub
	v.mu.Unlock()
	return nil
}

// Close unsubscribes. Idempotent.
func (v *Viewer) Close() {
	v.mu.Lock()
	sub := v.sub
	v.sub = nil
	v.mu.Unlock()
	if sub != nil {
		sub.Unsubscribe()
	}
}

// ViewerStats count the reports a Viewer received.
type ViewerStats struct {
	Received uint64 `json:"received"`
	// Dropped counts invalid reports; Refused those of gateways beyond
	// MaxGateways.
	Dropped uint64 `json:"dropped"`
	Refused uint64 `json:"refused"`
}

// Stats returns the counters.
func (v *Viewer) Stats() ViewerStats {
	return ViewerStats{Received: v.received.Load(), Dropped: v.dropped.Load(), Refused: v.refused.Load()}
}

// onReport runs on the subscription's goroutine.
func (v *Viewer) onReport(msg *nats.Msg) {
	v.received.Add(1)
	r, err := Decode(v.cfg.Prefix, msg.Subject, msg.Data)
	if err != nil {
		v.dropped.Add(1)
		v.log.Warn().Err(err).Msg("dropped a convergence report")
		return
	}
	now := v.now()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.forgetLocked(now)
	g := v.gateways[r.Gateway]
	switch {
	case g == nil && len(v.gateways) >= v.cfg.MaxGateways:
		v.refused.Add(1)
		return
	case g == nil:
		g = &gatewayState{}
		v.gateways[r.Gateway] = g
	case r.Seq <= g.report.Seq && !r.At.After(g.report.At):
		return // not newer than the one kept (a restarted gateway's seq starts again, its At moves on)
	}
	g.report, g.received = r, now
	for name, a := range r.Services {
		t := v.services[name]
		if t == nil {
			t = &target{}
			v.services[name] = t
		}
		if a.Revision > t.revision {
			if a.Digest == "" || a.Digest != t.digest {
				t.since = now
			}
			t.revision, t.digest = a.Revision, a.Digest
		}
	}
}

// forgetLocked forgets the gateways silent for three times Stale, and the
// services no gateway left reports.
func (v *Viewer) forgetLocked(now time.Time) {
	forgot := false
	for id, g := range v.gateways {
		if now.Sub(g.received) > 3*v.cfg.Stale {
			delete(v.gateways, id)
			forgot = true
		}
	}
	if !forgot {
		return
	}
	for name := range v.services {
		reported := false
		for _, g := range v.gateways {
			if _, ok := g.report.Services[name]; ok {
				reported = true
				break
			}
		}
		if !reported {
			delete(v.services, name)
		}
	}
}

// View is what a Viewer knows of the fleet.
type View struct {
	At       time.Time     `json:"at"`
	Gateways []GatewayView `json:"gateways"`
	Services []ServiceView `json:"services"`
}

// GatewayView is one reporting gateway.
type GatewayView struct {
	ID string `json:"id"`
	// LastReport is when its last report arrived; Stale says it is older
	// than ViewerConfig.Stale (the gateway stopped, or cannot reach NATS).
	LastReport time.Time `json:"lastReport"`
	Stale      bool      `json:"stale"`
	// Services is how many services it follows; Truncated says its
	// reports leave some out.
	Services  int  `json:"services"`
	Truncated bool `json:"truncated,omitempty"`
}

// ServiceView is one service across the gateways that follow it.
type ServiceView struct {
	Name string `json:"name"`
	// Revision is the newest revision of the service any gateway applied
	// and Digest the list at it (Applied.Digest); Since is when the
	// Viewer first heard of that list at the newest revision.
	Revision uint64    `json:"revision"`
	Digest   string    `json:"digest,omitempty"`
	Since    time.Time `json:"since"`
	// Gateways counts the fresh gateways that follow it; Behind lists
	// those whose list reflects an older revision and differs from the
	// newest (Digest), most behind first.
	Gateways int      `json:"gateways"`
	Behind   []Behind `json:"behind"`
}

// Behind is a gateway behind a service's newest revision.
type Behind struct {
	Gateway string `json:"gateway"`
	// Revision is the one its list reflects; For is how long the newest
	// one has existed without it.
	Revision uint64        `json:"revision"`
	For      time.Duration `json:"for"`
}

// View returns the fleet's state now: gateways by ID, services by name.
func (v *Viewer) View() View {
	now := v.now()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.forgetLocked(now)
	out := View{At: now, Gateways: []GatewayView{}, Services: []ServiceView{}}
	fresh := make(map[string]*gatewayState, len(v.gateways))
	for id, g := range v.gateways {
		stale := now.Sub(g.received) > v.cfg.Stale
		out.Gateways = append(out.Gateways, GatewayView{ID: id, LastReport: g.received, Stale: stale, Services: len(g.report.Services), Truncated: g.report.Truncated})
		if !stale {
			fresh[id] = g
		}
	}
	slices.SortFunc(out.Gateways, func(a, b GatewayView) int { return strings.Compare(a.ID, b.ID) })
	for name, t := range v.services {
		sv := ServiceView{Name: name, Revision: t.revision, Digest: t.digest, Since: t.since, Behind: []Behind{}}
		for id, g := range fresh {
			a, ok := g.report.Services[name]
			if !ok {
				continue
			}
			sv.Gateways++
			if t.lacks(a) {
				sv.Behind = append(sv.Behind, Behind{Gateway: id, Revision: a.Revision, For: now.Sub(t.since)})
			}
		}
		slices.SortFunc(sv.Behind, func(a, b Behind) int {
			if a.Revision != b.Revision {
				return cmpUint(a.Revision, b.Revision)
			}
			return strings.Compare(a.Gateway, b.Gateway)
		})
		out.Services = append(out.Services, sv)
	}
	slices.SortFunc(out.Services, func(a, b ServiceView) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
