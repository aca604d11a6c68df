package gateway

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/subscriber"
)

// metrics is the gateway's Prometheus registry. Counters that components
// already keep (subscriber, lookups, mirror, balancers) are read at scrape
// time; the rest are observed as they happen.
type metrics struct {
	reg *prometheus.Registry

	lag      prometheus.Histogram
	picks    *prometheus.CounterVec
	retries  *prometheus.CounterVec
	failures *prometheus.CounterVec
	requests *prometheus.HistogramVec
}

func newMetrics(g *Gateway) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pushlb_event_propagation_lag_seconds",
			Help:    "Time from an event's creation (its at field) to its arrival at the gateway.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}),
		picks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_picks_total", Help: "Servers chosen for a request attempt, by service.",
		}, []string{"service"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_retries_total", Help: "Request attempts after the first, by service.",
		}, []string{"service"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_attempt_failures_total", Help: "Request attempts that got no response, by service and kind (connect, other).",
		}, []string{"service", "kind"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pushlb_upstream_duration_seconds", Help: "Duration of request attempts to upstream servers, by service.",
			Buckets: prometheus.DefBuckets,
		}, []string{"service"}),
	}
	m.reg.MustRegister(m.lag, m.picks, m.retries, m.failures, m.requests,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{g: g})
	return m
}

// initService creates a service's series at zero, so dashboards and alerts
// see them before the first retry or failure.
func (m *metrics) initService(service string) {
	m.picks.WithLabelValues(service)
	m.retries.WithLabelValues(service)
	m.failures.WithLabelValues(service, "connect")
	m.failures.WithLabelValues(service, "other")
}

// observeEvent is the subscriber's OnEvent hook.
func (m *metrics) observeEvent(e events.Event) {
	m.lag.Observe(max(time.Since(e.At).Seconds(), 0))
}

var (
	descReceived   = prometheus.NewDesc("pushlb_events_received_total", "Messages received on the change subjects.", nil, nil)
	descApplied    = prometheus.NewDesc("pushlb_events_applied_total", "Events that changed a service's live set.", nil, nil)
	descDropped    = prometheus.NewDesc("pushlb_events_dropped_total", "Messages dropped, by reason.", []string{"reason"}, nil)
	descDelivered  = prometheus.NewDesc("pushlb_list_deliveries_total", "Full lists handed to the balancers.", nil, nil)
	descHandlerErr = prometheus.NewDesc("pushlb_list_delivery_errors_total", "List deliveries that failed and were retried.", nil, nil)
	descReconciles = prometheus.NewDesc("pushlb_reconciles_total", "Reconciliations of a service with the registry.", nil, nil)
	descRemovals   = prometheus.NewDesc("pushlb_registry_removals_total", "Instances taken offline because the registry lost them (deregistered, lease expired).", nil, nil)
	descResyncs    = prometheus.NewDesc("pushlb_registry_resyncs_total", "Full resynchronisations of the registry mirror (start, reconnects).", nil, nil)
	descLookupHit  = prometheus.NewDesc("pushlb_lookups_total", "Instance-ID lookups, by result (hit, fallback, failure).", []string{"result"}, nil)
	descServers    = prometheus.NewDesc("pushlb_servers", "Servers listed per service.", []string{"service"}, nil)
	descReachable  = prometheus.NewDesc("pushlb_servers_reachable", "Servers alive per service.", []string{"service"}, nil)
	descTrips      = prometheus.NewDesc("pushlb_breaker_trips_total", "Circuit breakers tripped, by service.", []string{"service"}, nil)
	descGossipGone = prometheus.NewDesc("pushlb_gossip_removals_total", "Instances taken offline because gossip declared them dead or gone.", nil, nil)
	descGossipBack = prometheus.NewDesc("pushlb_gossip_revivals_total", "Instances gossip brought back (refuted suspicions).", nil, nil)
	descGossipMem  = prometheus.NewDesc("pushlb_gossip_members", "Members of the gossip cluster this gateway sees, itself included.", nil, nil)
	descUpdates    = prometheus.NewDesc("pushlb_list_updates_total", "Changes of a service's server list.", []string{"service"}, nil)
)

// stateCollector reads the components' own counters at scrape time.
type stateCollector struct{ g *Gateway }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReceived, descApplied, descDropped, descDelivered, descHandlerErr,
		descReconciles, descRemovals, descResyncs, descLookupHit, descServers, descReachable, descTrips, descUpdates, descGossipGone, descGossipBack, descGossipMem} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	if sub := c.g.sub; sub != nil {
		st := sub.Stats()
		counter(descReceived, st.Received)
		counter(descApplied, st.Applied)
		for _, r := range subscriber.DropReasons {
			counter(descDropped, st.Dropped[r], r)
		}
		counter(descDelivered, st.Delivered)
		counter(descHandlerErr, st.HandlerErrors)
		counter(descReconciles, st.Reconciles)
		counter(descRemovals, st.RegistryRemovals)
		counter(descResyncs, sub.Mirror().Stats().Syncs)
		counter(descGossipGone, st.GossipRemovals)
		counter(descGossipBack, st.GossipRevivals)
	}
	if n := c.g.gossip; n != nil {
		gauge(descGossipMem, n.NumMembers())
	}
	if l := c.g.lookup; l != nil {
		st := l.Stats()
		counter(descLookupHit, st.Hits, "hit")
		counter(descLookupHit, st.Fallbacks, "fallback")
		counter(descLookupHit, st.Failures, "failure")
	}
	if c.g.bals != nil {
		for name, t := range c.g.bals.all() {
			snap := t.b.Snapshot()
			gauge(descServers, len(snap.All()), name)
			gauge(descReachable, len(snap.Reachable()), name)
			counter(descTrips, t.b.BreakerTrips(), name)
			counter(descUpdates, t.updates.Load(), name)
		}
	}
}
