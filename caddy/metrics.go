package pushlbcaddy

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exposes a shared client's state in Caddy's metrics (the admin
// endpoint's /metrics), under the names the gateway uses, each labelled
// with the registry (its NATS URLs and prefix). It reads the client's
// Stats at each scrape: nothing is counted on the request path.
type collector struct {
	s *shared

	servers, reachable, trips, updates *prometheus.Desc
	received, applied, dropped         *prometheus.Desc
	gossipRemovals, gossipMembers      *prometheus.Desc
}

func newCollector(s *shared) *collector {
	l := prometheus.Labels{"registry": s.name}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, l)
	}
	return &collector{
		s:              s,
		servers:        d("pushlb_servers", "Servers listed per service.", "service"),
		reachable:      d("pushlb_servers_reachable", "Servers a pick may choose per service: alive, with a closed circuit breaker.", "service"),
		trips:          d("pushlb_breaker_trips_total", "Circuit breakers tripped, by service.", "service"),
		updates:        d("pushlb_list_updates_total", "Changes of a service's server list.", "service"),
		received:       d("pushlb_events_received_total", "Messages received on the change subjects."),
		applied:        d("pushlb_events_applied_total", "Events that changed a service's live set."),
		dropped:        d("pushlb_events_dropped_total", "Messages dropped, by reason.", "reason"),
		gossipRemovals: d("pushlb_gossip_removals_total", "Instances taken offline because gossip declared them dead or gone."),
		gossipMembers:  d("pushlb_gossip_members", "Members of the gossip cluster this client sees, itself included."),
	}
}

// Describe sends the descriptors (prometheus.Collector).
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.servers, c.reachable, c.trips, c.updates, c.received, c.applied, c.dropped, c.gossipRemovals, c.gossipMembers} {
		ch <- d
	}
}

// Collect sends the current values (prometheus.Collector).
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.client.Stats()
	for _, sv := range st.Services {
		ch <- prometheus.MustNewConstMetric(c.servers, prometheus.GaugeValue, float64(sv.Servers), sv.Name)
		ch <- prometheus.MustNewConstMetric(c.reachable, prometheus.GaugeValue, float64(sv.Reachable), sv.Name)
		ch <- prometheus.MustNewConstMetric(c.trips, prometheus.CounterValue, float64(sv.BreakerTrips), sv.Name)
		ch <- prometheus.MustNewConstMetric(c.updates, prometheus.CounterValue, float64(sv.Updates), sv.Name)
	}
	ch <- prometheus.MustNewConstMetric(c.received, prometheus.CounterValue, float64(st.Events.Received))
	ch <- prometheus.MustNewConstMetric(c.applied, prometheus.CounterValue, float64(st.Events.Applied))
	for reason, n := range st.Events.Dropped {
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(n), reason)
	}
	ch <- prometheus.MustNewConstMetric(c.gossipRemovals, prometheus.CounterValue, float64(st.Events.GossipRemovals))
	ch <- prometheus.MustNewConstMetric(c.gossipMembers, prometheus.GaugeValue, float64(st.Gossip.Members))
}

// register adds the collector of s to reg, once per config: the sources
// of one config that share s register the same descriptors, and the
// second registration is refused as already done.
func register(reg prometheus.Registerer, s *shared) error {
	if reg == nil {
		return nil
	}
	err := reg.Register(newCollector(s))
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		return nil
	}
	return err
}
