package gateway

import (
	"time"

	"github.com/pushlb/pushlb/balancer"
)

// summarizeOver is the number of instances on the gateway (every
// service's together) above which the streams carry per-service
// summaries (ServiceSummary) instead of every instance: the page
// fetches an opened service's instances from /-/lb/service. 5,000
// instances make a first state of about 1.9 MB in full; 100,000 would
// make 37 MB.
const summarizeOver = 5000

// ServiceSummary is what a stream carries of a service when the gateway
// holds more than summarizeOver instances: what its folded line on the
// page shows, without its instances (GET /-/lb/service?name= has them).
type ServiceSummary struct {
	Name string `json:"name"`
	Rule string `json:"rule"`
	// Instances counts the service's servers: Up those alive with a closed
	// breaker, Tripped those alive with an open one (the others are down).
	Instances  int                  `json:"instances"`
	Up         int                  `json:"up"`
	Tripped    int                  `json:"tripped"`
	Zones      map[string]ZoneState `json:"zones"`
	Updates    uint64               `json:"updates"`
	LastChange *time.Time           `json:"lastChange,omitempty"`
	Trips      uint64               `json:"breakerTrips"`
}

// streamState is the stream's first event: the State, its services in
// summaries when the gateway holds more than summarizeOver instances.
type streamState struct {
	State
	Summaries []ServiceSummary `json:"summaries,omitempty"`
}

// instances counts the servers of every service.
func (g *Gateway) instances() int {
	if g.client == nil {
		return 0
	}
	n := 0
	for _, name := range g.client.Services() {
		if sv, ok := g.client.ServiceStats(name); ok {
			n += sv.Servers
		}
	}
	return n
}

// summarizing reports whether the streams carry summaries: the gateway
// holds more than summarizeOver instances.
func (d *dashboard) summarizing() bool { return d.g.instances() > d.summarizeOver }

// firstState is a stream's first event: the whole State, or the services'
// summaries beyond summarizeOver instances.
func (d *dashboard) firstState() streamState {
	if !d.summarizing() {
		return streamState{State: d.g.State()}
	}
	st := streamState{State: d.g.header(), Summaries: []ServiceSummary{}}
	st.Services = []ServiceState{}
	st.Timeline = d.Timeline()
	for _, name := range d.g.client.Services() {
		if sum, ok := d.g.serviceSummary(name); ok {
			st.Summaries = append(st.Summaries, sum)
		}
	}
	return st
}

// serviceSummary reads one service's summary; false when it has none.
func (g *Gateway) serviceSummary(name string) (ServiceSummary, bool) {
	if g.client == nil {
		return ServiceSummary{}, false
	}
	sv, ok := g.client.ServiceStats(name)
	if !ok {
		return ServiceSummary{}, false
	}
	b, err := g.client.Balancer(name)
	if err != nil {
		return ServiceSummary{}, false
	}
	cfg := b.Config()
	sum := ServiceSummary{Name: name, Rule: cfg.Rule, Zones: map[string]ZoneState{}, Updates: sv.Updates, Trips: sv.BreakerTrips}
	if !sv.LastChange.IsZero() {
		sum.LastChange = &sv.LastChange
	}
	zones := b.ZoneSnapshots()
	for z, zs := range zones {
		sum.Zones[z] = ZoneState{Instances: zs.InstanceCount, Tripped: zs.TrippedCount, ActiveRequests: zs.ActiveRequests, LoadPerServer: zs.LoadPerServer}
	}
	if (cfg.ZoneAware || cfg.Rule == balancer.RuleZoneAvoidance) && len(zones) > 1 {
		markAvoided(sum.Zones, cfg.ZoneAvoidance)
	}
	for _, s := range b.Servers() {
		sum.Instances++
		switch {
		case !s.Alive():
		case s.PeekStats().CircuitTripped():
			sum.Tripped++
		default:
			sum.Up++
		}
	}
	return sum, true
}
