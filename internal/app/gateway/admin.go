package gateway

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"html"
	"html/template"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/convergence"
	"github.com/pushlb/pushlb/serverlist"
)

// State is what /-/lb shows: every service the gateway balances, and the
// recent list changes. Every key is camelCase (docs/config.md).
type State struct {
	// Time is when the state was read, with the gateway's UTC offset.
	Time time.Time `json:"time"`
	// Zone is the gateway's zone: its own (-zone, zone:) or else the
	// balancer defaults' (a .properties file's zone); empty for none.
	Zone       string                `json:"zone,omitempty"`
	Services   []ServiceState        `json:"services"`
	Timeline   []TimelineEntry       `json:"timeline"`
	Subscriber *pushlb.EventStats    `json:"subscriber,omitempty"`
	Lookups    *pushlb.LookupStats   `json:"lookups,omitempty"`
	Mirror     *pushlb.RegistryStats `json:"mirror,omitempty"`
	// Advisories is crash detection by client-disconnect advisories: its
	// state and counters.
	Advisories *pushlb.AdvisoryStats `json:"advisories,omitempty"`
	// Regions are the other regions whose records the registry holds
	// copies of, stale or not (docs/multiregion.md); omitted without
	// -region or copies.
	Regions []serverlist.RegionView `json:"regions,omitempty"`
	// Replication is this gateway's copying of other regions' records
	// (-remote-region), omitted without it.
	Replication *serverlist.ReplicatorStats `json:"replication,omitempty"`
}

// ServiceState is one service's balancer.
type ServiceState struct {
	Name       string               `json:"name"`
	Rule       string               `json:"rule"`
	Servers    []ServerState        `json:"servers"`
	Zones      map[string]ZoneState `json:"zones"`
	Updates    uint64               `json:"updates"`
	LastChange *time.Time           `json:"lastChange,omitempty"`
	Trips      uint64               `json:"breakerTrips"`
	Ejections  uint64               `json:"ejections,omitempty"`
	// Panic: too few healthy servers, picks balance over all of them
	// (the balancer's panicThreshold).
	Panic bool `json:"panic,omitempty"`
	// Held: the registry lost the service's instances at once, and its
	// last list is kept (emptyListHold).
	Held bool `json:"held,omitempty"`
}

// ZoneState summarises a zone of a service.
type ZoneState struct {
	Instances      int     `json:"instances"`
	Tripped        int     `json:"tripped"`
	ActiveRequests int64   `json:"activeRequests"`
	LoadPerServer  float64 `json:"loadPerServer"`
	// Avoided reports that the zone crosses the service's zone-avoidance
	// thresholds (a share of tripped servers at blackoutPercentage, or the
	// worst load per server at triggeringLoadPerServer) while its rule or
	// zoneAware avoids zones and it has several: read from the zone
	// statistics and the configuration, as the balancer decides.
	Avoided bool `json:"avoided"`
}

// ServerState is one instance in a balancer.
type ServerState struct {
	ID     string `json:"id"`
	Addr   string `json:"addr"`
	Scheme string `json:"scheme"`
	Zone   string `json:"zone"`
	// Region is the instance's region, empty for the registry's own
	// (docs/balancer.md, "Regions").
	Region   string            `json:"region,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Status is "up", "tripped" (alive, but its circuit breaker is open:
	// it gets no request until the blackout ends), "ejected" (alive, but
	// outlier detection ejected it for its server errors) or "down"
	// (marked down by a ping or the registry).
	Status         string  `json:"status"`
	Alive          bool    `json:"alive"`
	ActiveRequests int64   `json:"activeRequests"`
	Requests       int64   `json:"requests"`
	PickShare      float64 `json:"pickShare"` // of the service's requests, 0 to 1
	ResponseTimeMs float64 `json:"responseTimeMs"`
	Failures       int64   `json:"successiveFailures"`
	Tripped        bool    `json:"breakerTripped"`
	BlackoutMs     int64   `json:"blackoutRemainingMs"`
	ServerErrors   int64   `json:"successiveServerErrors,omitempty"`
	EjectedMs      int64   `json:"ejectionRemainingMs,omitempty"`
}

// State returns the current state of every service.
func (g *Gateway) State() State {
	st := g.header()
	st.Services = []ServiceState{}
	st.Timeline = g.dash.Timeline()
	if g.client == nil {
		return st
	}
	for _, name := range g.client.Services() {
		if ss, ok := g.serviceState(name); ok {
			st.Services = append(st.Services, ss)
		}
	}
	return st
}

// zone is the gateway's own zone, or else the balancer defaults' (set by
// a .properties file).
func (g *Gateway) zone() string {
	if g.cfg.Zone != "" {
		return g.cfg.Zone
	}
	if c := g.cfg.Balancer.ClientsConfig; c != nil {
		return c.Defaults.Zone
	}
	return ""
}

// header is the State without services and timeline: the gateway's zone
// and counters.
func (g *Gateway) header() State {
	st := State{Time: time.Now(), Zone: g.zone()}
	if g.client == nil {
		return st
	}
	cs := g.client.Stats()
	if cs.Started {
		st.Subscriber, st.Mirror, st.Lookups, st.Advisories = &cs.Events, &cs.Registry, &cs.Lookups, &cs.Advisories
		st.Regions = cs.Regions
		if len(cs.Replication.Remotes) > 0 {
			st.Replication = &cs.Replication
		}
	}
	return st
}

// serviceState reads one service's balancer; false when it has none.
func (g *Gateway) serviceState(name string) (ServiceState, bool) {
	if g.client == nil {
		return ServiceState{}, false
	}
	sv, ok := g.client.ServiceStats(name)
	if !ok {
		return ServiceState{}, false
	}
	b, err := g.client.Balancer(name)
	if err != nil {
		return ServiceState{}, false
	}
	cfg := b.Config()
	ss := ServiceState{Name: name, Rule: cfg.Rule, Servers: []ServerState{}, Zones: map[string]ZoneState{},
		Updates: sv.Updates, Trips: sv.BreakerTrips, Ejections: sv.Ejections, Panic: sv.Panic, Held: sv.Held}
	if !sv.LastChange.IsZero() {
		ss.LastChange = &sv.LastChange
	}
	zones := b.ZoneSnapshots()
	for z, zs := range zones {
		ss.Zones[z] = ZoneState{Instances: zs.InstanceCount, Tripped: zs.TrippedCount, ActiveRequests: zs.ActiveRequests, LoadPerServer: zs.LoadPerServer}
	}
	if (cfg.ZoneAware || cfg.Rule == balancer.RuleZoneAvoidance) && len(zones) > 1 {
		markAvoided(ss.Zones, cfg.ZoneAvoidance)
	}
	var total int64
	for _, s := range b.Servers() {
		stats := s.PeekStats()
		rt, _ := stats.ResponseTime()
		srv := ServerState{
			ID: s.ID, Addr: s.Addr(), Scheme: s.URLScheme(), Zone: s.Zone, Region: s.Region, Metadata: s.Metadata, Alive: s.Alive(),
			ActiveRequests: stats.ActiveRequests(), Requests: stats.Requests(),
			ResponseTimeMs: float64(rt.Microseconds()) / 1000, Failures: stats.SuccessiveFailures(),
			Tripped: stats.CircuitTripped(), BlackoutMs: stats.BlackoutRemaining().Milliseconds(),
			ServerErrors: stats.SuccessiveServerErrors(), EjectedMs: stats.EjectionRemaining().Milliseconds(),
		}
		switch {
		case !srv.Alive:
			srv.Status = "down"
		case srv.Tripped:
			srv.Status = "tripped"
		case srv.EjectedMs > 0:
			srv.Status = "ejected"
		default:
			srv.Status = "up"
		}
		total += srv.Requests
		ss.Servers = append(ss.Servers, srv)
	}
	if total > 0 {
		for i := range ss.Servers {
			ss.Servers[i].PickShare = float64(ss.Servers[i].Requests) / float64(total)
		}
	}
	return ss, true
}

// markAvoided marks the zones the zone-avoidance logic leaves out, as the
// balancer's avoidZonesOf does after Ribbon's
// ZoneAvoidanceRule.getAvailableZones: zones without a server or with a
// tripped share at the blackout percentage, then, when the worst load per
// server of the rest reaches the triggering load (or a zone was dropped),
// the worst zone (every one tied for worst: the balancer drops one of
// them), but never the last zone left. With no zone left at all, the
// balancer uses every server: no zone is avoided.
func markAvoided(zones map[string]ZoneState, th balancer.ZoneAvoidanceConfig) {
	out := func(zs ZoneState) bool {
		return zs.Instances == 0 || zs.LoadPerServer < 0 || float64(zs.Tripped)/float64(zs.Instances) >= th.BlackoutPercentage
	}
	worst, limited, avail := -1.0, false, 0
	for _, zs := range zones {
		if out(zs) {
			limited = true
			continue
		}
		avail++
		worst = max(worst, zs.LoadPerServer)
	}
	if avail == 0 {
		return
	}
	for z, zs := range zones {
		if out(zs) {
			zs.Avoided = true
			zones[z] = zs
		}
	}
	if avail == 1 || (worst < th.TriggeringLoadPerServer && !limited) {
		return
	}
	for z, zs := range zones {
		if !zs.Avoided && zs.LoadPerServer == worst {
			zs.Avoided = true
			zones[z] = zs
		}
	}
}

// adminHandler serves /-/lb, /metrics, /healthz and /readyz, and at / the
// list of them; another path is a 404.
func (g *Gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", g.serveIndex)
	mux.HandleFunc("GET /-/lb", g.serveState)
	mux.HandleFunc("GET /-/lb/events", g.dash.serveEvents)
	mux.HandleFunc("GET /-/lb/service", g.serveService)
	mux.Handle("GET /metrics", g.metrics.handler(g))
	mux.HandleFunc("GET /-/fleet", g.serveFleet)
	mux.HandleFunc("GET /healthz", g.serveHealth)
	mux.HandleFunc("GET /readyz", g.serveReady)
	if g.cfg.Pprof {
		registerPprof(mux)
	} else {
		mux.HandleFunc("GET /debug/pprof/", servePprofOff)
	}
	if g.demo != nil {
		mux.HandleFunc("POST /-/demo/stop/{name}", g.demo.serveStop)
		mux.HandleFunc("POST /-/demo/start/{name}", g.demo.serveStart)
	}
	return mux
}

// endpoint is one path of the admin listener, as / lists them.
type endpoint struct {
	Path  string `json:"path"`
	About string `json:"about"`
}

// endpoints are the admin listener's paths, as / lists them.
func (g *Gateway) endpoints() []endpoint {
	eps := []endpoint{
		{"/-/lb", "services, instances, zones and recent list changes: JSON, or a live page in a browser"},
		{"/-/lb/events", "the same state pushed as server-sent events"},
		{"/-/lb/service?name=SERVICE", "one service with its instances"},
		{"/-/fleet", "per service, which gateways are behind the newest revision and for how long (fleetView): JSON, or a page in a browser"},
		{"/metrics", "Prometheus metrics"},
		{"/healthz", "liveness: 200 while the process serves"},
		{"/readyz", "readiness: 200 once the routing state is loaded"},
	}
	if g.cfg.Pprof {
		eps = append(eps, endpoint{"/debug/pprof/", "Go profiles"})
	}
	return eps
}

// serveFleet is GET /-/fleet: the fleet view of a gateway with fleetView,
// else a 404 that says how to turn it on.
func (g *Gateway) serveFleet(w http.ResponseWriter, r *http.Request) {
	if g.fleet == nil {
		http.Error(w, "no fleet view: run the gateway with fleetView: true (-fleet-view), and the gateways with report: {id: ...} (-report-id)", http.StatusNotFound)
		return
	}
	view := g.fleet.View()
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := fleetPage.Execute(w, view); err != nil {
			g.log.Debug().Err(err).Msg("fleet page")
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(struct {
		convergence.View
		Stats convergence.ViewerStats `json:"stats"`
	}{view, g.fleet.Stats()})
}

// fleetPage is /-/fleet for a browser: per service, the newest revision
// and the gateways behind it; then the gateways. It refreshes itself.
var fleetPage = template.Must(template.New("fleet").Parse(`<!doctype html><meta charset=utf-8>
<meta http-equiv="refresh" content="2"><title>pushlb fleet</title>
<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}.behind{color:#b00}</style>
<h1>Fleet convergence</h1><p>{{len .Gateways}} gateways, {{len .Services}} services, at {{.At.Format "15:04:05.000"}}</p>
<table><tr><th>service</th><th>newest revision</th><th>gateways</th><th>behind</th></tr>
{{range .Services}}<tr><td>{{.Name}}</td><td>{{.Revision}}</td><td>{{.Gateways}}</td><td>{{range .Behind}}<span class=behind>{{.Gateway}} at {{.Revision}} for {{.For}}</span> {{else}}none{{end}}</td></tr>
{{end}}</table>
<h2>Gateways</h2><table><tr><th>gateway</th><th>services</th><th>last report</th><th></th></tr>
{{range .Gateways}}<tr><td>{{.ID}}</td><td>{{.Services}}</td><td>{{.LastReport.Format "15:04:05.000"}}</td><td>{{if .Stale}}stale{{end}}{{if .Truncated}} truncated{{end}}</td></tr>
{{end}}</table>
`))

// serveIndex is GET /: where to look, rather than a bare 404 for a person
// who opens the admin address. JSON, or a page of links for a browser.
func (g *Gateway) serveIndex(w http.ResponseWriter, r *http.Request) {
	eps := g.endpoints()
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		var b strings.Builder
		b.WriteString("<!doctype html><meta charset=utf-8><title>pushlb gateway</title><h1>pushlb gateway</h1><ul>\n")
		for _, ep := range eps {
			fmt.Fprintf(&b, "<li><a href=\"%s\">%s</a>: %s\n", html.EscapeString(ep.Path), html.EscapeString(ep.Path), html.EscapeString(ep.About))
		}
		b.WriteString("</ul>\n")
		io.WriteString(w, b.String())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(struct {
		Endpoints []endpoint `json:"endpoints"`
	}{eps})
}

// serveService is GET /-/lb/service?name=: one service as /-/lb shows it,
// with every instance; the page fetches it when a service is opened while
// the stream carries summaries.
func (g *Gateway) serveService(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	if name == "" {
		http.Error(w, "usage: GET /-/lb/service?name=SERVICE", http.StatusBadRequest)
		return
	}
	ss, ok := g.serviceState(name)
	if !ok {
		http.Error(w, "no such service", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	json.NewEncoder(w).Encode(ss)
}

func (g *Gateway) serveState(w http.ResponseWriter, r *http.Request) {
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(dashboardHTML)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(g.State())
}

// dashboardHTML is the page /-/lb serves to browsers: it renders the
// state pushed by /-/lb/events as it arrives, without reloading.
//
//go:embed dashboard.html
var dashboardHTML []byte
