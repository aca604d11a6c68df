package pushlbxds

import "github.com/prometheus/client_golang/prometheus"

// NewCollector returns a Prometheus collector of s's Stats under the names
// pushlb_xds_*, read at each scrape: nothing is counted on the xDS path
// for it. Register it with the registry your /metrics serves; the
// gateway's -xds has it on the gateway's /metrics.
func NewCollector(s *Server) prometheus.Collector {
	return newCollector(func() *Server { return s })
}

// collector exposes the Stats of the server that server returns; nothing
// while it returns nil (the gateway's -xds is off).
type collector struct {
	server func() *Server

	services, listUpdates, clientZones, streams, responses *prometheus.Desc
	nacks, dropped, badWeights, invalid                    *prometheus.Desc
	follows                                                *prometheus.Desc
}

func newCollector(server func() *Server) *collector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &collector{
		server:      server,
		services:    d("pushlb_xds_services", "Services served over xDS: a Listener, RouteConfiguration, Cluster and ClusterLoadAssignment each."),
		listUpdates: d("pushlb_xds_list_updates_total", "Lists installed: each a new version of the service's ClusterLoadAssignment for every client zone."),
		clientZones: d("pushlb_xds_client_zones", "Client zones served with their zone first."),
		streams:     d("pushlb_xds_streams", "Open xDS streams."),
		responses:   d("pushlb_xds_responses_total", "Responses sent on the xDS streams, state of the world and delta."),
		nacks:       d("pushlb_xds_nacks_total", "Responses a client rejected (NACK), each logged with the client's error."),
		dropped:     d("pushlb_xds_dropped_instances_total", "Instances left out of a ClusterLoadAssignment (logged): an address another instance has, no host or port."),
		badWeights:  d("pushlb_xds_bad_weights_total", "Instances whose weight metadata was ignored (logged)."),
		invalid:     d("pushlb_xds_invalid_resources_total", "Resources not installed because they failed validation (logged); the previous version stays."),
		follows: prometheus.NewDesc("pushlb_xds_follows_total",
			"Names the xDS streams subscribed to that the server followed on demand, by result: followed, failed (none registered, a timeout), refused (64 under way).", []string{"result"}, nil),
	}
}

// Describe sends the descriptors (prometheus.Collector).
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.services, c.listUpdates, c.clientZones, c.streams, c.responses, c.nacks, c.dropped, c.badWeights, c.invalid, c.follows} {
		ch <- d
	}
}

// Collect sends the current values (prometheus.Collector).
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.server()
	if s == nil {
		return
	}
	st := s.Stats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(c.services, float64(st.Services))
	counter(c.listUpdates, st.ListUpdates)
	gauge(c.clientZones, float64(st.ClientZones))
	gauge(c.streams, float64(st.Streams))
	counter(c.responses, st.Responses)
	counter(c.nacks, st.NACKs)
	counter(c.dropped, st.DroppedInstances)
	counter(c.badWeights, st.BadWeights)
	counter(c.invalid, st.InvalidResources)
	for result, v := range map[string]uint64{"followed": st.Follows, "failed": st.FollowsFailed, "refused": st.FollowsRefused} {
		ch <- prometheus.MustNewConstMetric(c.follows, prometheus.CounterValue, float64(v), result)
	}
}

var _ prometheus.Collector = (*collector)(nil)
