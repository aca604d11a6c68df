package gateway

import (
	"encoding/json"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// State is what /-/lb shows: every service the gateway balances.
type State struct {
	Zone       string                  `json:"zone,omitempty"`
	Services   []ServiceState          `json:"services"`
	Subscriber *subscriber.Stats       `json:"subscriber,omitempty"`
	Lookups    *serverlist.LookupStats `json:"lookups,omitempty"`
	Mirror     *serverlist.MirrorStats `json:"mirror,omitempty"`
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
}

// ZoneState summarises a zone of a service.
type ZoneState struct {
	Instances      int     `json:"instances"`
	Tripped        int     `json:"tripped"`
	ActiveRequests int64   `json:"activeRequests"`
	LoadPerServer  float64 `json:"loadPerServer"`
}

// ServerState is one instance in a balancer.
type ServerState struct {
	ID             string  `json:"id"`
	Addr           string  `json:"addr"`
	Scheme         string  `json:"scheme"`
	Zone           string  `json:"zone"`
	Alive          bool    `json:"alive"`
	ActiveRequests int64   `json:"activeRequests"`
	Requests       int64   `json:"requests"`
	ResponseTimeMs float64 `json:"responseTimeMs"`
	Failures       int64   `json:"successiveFailures"`
	Tripped        bool    `json:"breakerTripped"`
	BlackoutMs     int64   `json:"blackoutRemainingMs"`
}

// State returns the current state of every service.
func (g *Gateway) State() State {
	st := State{Zone: g.cfg.Zone, Services: []ServiceState{}}
	if g.client == nil {
		return st
	}
	cs := g.client.Stats()
	if cs.Started {
		st.Subscriber, st.Mirror, st.Lookups = &cs.Events, &cs.Registry, &cs.Lookups
	}
	for _, sv := range cs.Services {
		b, err := g.client.Balancer(sv.Name)
		if err != nil {
			continue
		}
		ss := ServiceState{Name: sv.Name, Rule: b.Config().Rule, Servers: []ServerState{}, Zones: map[string]ZoneState{},
			Updates: sv.Updates, Trips: sv.BreakerTrips}
		if !sv.LastChange.IsZero() {
			ss.LastChange = &sv.LastChange
		}
		for z, zs := range b.ZoneSnapshots() {
			ss.Zones[z] = ZoneState{Instances: zs.InstanceCount, Tripped: zs.TrippedCount, ActiveRequests: zs.ActiveRequests, LoadPerServer: zs.LoadPerServer}
		}
		for _, s := range b.AllServers() {
			stats := s.Stats()
			rt, _ := stats.ResponseTime()
			ss.Servers = append(ss.Servers, ServerState{
				ID: s.ID, Addr: s.Addr(), Scheme: s.URLScheme(), Zone: s.Zone, Alive: s.Alive(),
				ActiveRequests: stats.ActiveRequests(), Requests: stats.Requests(),
				ResponseTimeMs: float64(rt.Microseconds()) / 1000, Failures: stats.SuccessiveFailures(),
				Tripped: stats.CircuitTripped(), BlackoutMs: stats.BlackoutRemaining().Milliseconds(),
			})
		}
		st.Services = append(st.Services, ss)
	}
	return st
}

// adminHandler serves /-/lb, /metrics, /healthz and /readyz.
func (g *Gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /-/lb", g.serveState)
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", g.serveHealth)
	mux.HandleFunc("GET /readyz", g.serveReady)
	if g.demo != nil {
		mux.HandleFunc("POST /-/demo/stop/{name}", g.demo.serveStop)
		mux.HandleFunc("POST /-/demo/start/{name}", g.demo.serveStart)
	}
	return mux
}

func (g *Gateway) serveState(w http.ResponseWriter, r *http.Request) {
	st := g.State()
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := stateHTML.Execute(w, st); err != nil {
			g.log.Warn().Err(err).Msg("rendering /-/lb")
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(st)
}

var stateHTML = template.Must(template.New("lb").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>pushlb</title><meta http-equiv="refresh" content="2">
<style>
body{font:14px system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 2em}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
th{background:#f3f3f3}.down{color:#b00}.ok{color:#080}small{color:#666}
</style></head><body>
<h1>pushlb gateway</h1>
<p>Zone: <b>{{if .Zone}}{{.Zone}}{{else}}(none){{end}}</b>
{{with .Subscriber}} · events received {{.Received}}, applied {{.Applied}}, lists delivered {{.Delivered}}{{end}}
{{with .Mirror}} · registry instances {{.Instances}}{{end}} <small>(refreshes every 2 s)</small></p>
{{range .Services}}
<h2>{{.Name}} <small>rule {{.Rule}} · {{len .Servers}} servers · {{.Updates}} updates{{with .LastChange}} · last change {{.Format "15:04:05.000"}}{{end}} · breaker trips {{.Trips}}</small></h2>
<table><tr><th>instance</th><th>address</th><th>zone</th><th>alive</th><th>active</th><th>requests</th><th>resp. time ms</th><th>breaker</th></tr>
{{range .Servers}}<tr><td>{{.ID}}</td><td>{{.Scheme}}://{{.Addr}}</td><td>{{.Zone}}</td>
<td>{{if .Alive}}<span class="ok">yes</span>{{else}}<span class="down">no</span>{{end}}</td>
<td>{{.ActiveRequests}}</td><td>{{.Requests}}</td><td>{{printf "%.2f" .ResponseTimeMs}}</td>
<td>{{if .Tripped}}<span class="down">open {{.BlackoutMs}} ms</span>{{else}}closed{{end}} ({{.Failures}} failures)</td></tr>
{{end}}</table>
{{else}}<p>No service yet: announce an instance (see the README).</p>{{end}}
</body></html>`))
