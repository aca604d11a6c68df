package gateway

import (
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/lbhttp"
	"github.com/pushlb/pushlb/subscriber"
)

// metrics is the gateway's Prometheus registry. Counters that components
// already keep (subscriber, lookups, mirror, balancers) are read at scrape
// time; the rest are observed as they happen.
type metrics struct {
	reg *prometheus.Registry

	lag      prometheus.Histogram
	applyLag *prometheus.HistogramVec
	picks    *prometheus.CounterVec
	retries  *prometheus.CounterVec
	denied   *prometheus.CounterVec
	failures *prometheus.CounterVec
	requests *prometheus.HistogramVec
	subsets  *prometheus.CounterVec

	// stateReg holds the series read from the client's state at scrape
	// time (stateCollector), the per-service ones included, for the
	// scrapes that ask for a format other than text (metrics_text.go).
	stateReg *prometheus.Registry

	services sync.Map // service name -> *serviceMetrics
}

func newMetrics(g *Gateway) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pushlb_event_propagation_lag_seconds",
			Help:    "Time from an event's creation (its at field) to its arrival at the gateway.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}),
		applyLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pushlb_list_apply_lag_seconds",
			Help:    "Time from an event's creation (its at field) to the change it caused in a balancer's list, by cause (announce, offline): the convergence of this gateway.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"cause"}),
		picks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_picks_total", Help: "Servers chosen for a request attempt, by service.",
		}, []string{"service"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_retries_total", Help: "Request attempts after the first, by service.",
		}, []string{"service"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_retries_denied_total", Help: "Retries the retry policy allowed and the service's retry budget refused, by service.",
		}, []string{"service"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_attempt_failures_total", Help: "Request attempts that got no response, by service and kind (connect, other).",
		}, []string{"service", "kind"}),
		requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pushlb_upstream_duration_seconds", Help: "Duration of request attempts to upstream servers, by service.",
			Buckets: prometheus.DefBuckets,
		}, []string{"service"}),
		subsets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_subset_requests_total", Help: "Requests a route sent to a subset of a service's instances (its subset, or its split's share), by service and subset selector.",
		}, []string{"service", "subset"}),
	}
	m.reg.MustRegister(m.lag, m.applyLag, m.picks, m.retries, m.denied, m.failures, m.requests, m.subsets,
		// go_gc_heap_live_bytes besides the defaults: the heap the last
		// collection marked, which the collector lets grow to twice that
		// (GOGC=100) before the next: what the resident memory follows.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.stateReg = prometheus.NewRegistry()
	m.stateReg.MustRegister(&stateCollector{g: g})
	return m
}

// serviceMetrics are one service's request series, resolved once so that
// a request does no label lookup.
type serviceMetrics struct {
	picks, retries, denied, connectFailures, otherFailures prometheus.Counter
	requests                                               prometheus.Observer
}

// service returns the series of a service, creating them all at once (at
// zero) on its first request, so dashboards and alerts see the retry and
// failure series before the first retry or failure.
func (m *metrics) service(name string) *serviceMetrics {
	if sm, ok := m.services.Load(name); ok {
		return sm.(*serviceMetrics)
	}
	sm, _ := m.services.LoadOrStore(name, &serviceMetrics{
		picks:           m.picks.WithLabelValues(name),
		retries:         m.retries.WithLabelValues(name),
		denied:          m.denied.WithLabelValues(name),
		connectFailures: m.failures.WithLabelValues(name, "connect"),
		otherFailures:   m.failures.WithLabelValues(name, "other"),
		requests:        m.requests.WithLabelValues(name),
	})
	return sm.(*serviceMetrics)
}

// observer is the Transport's Observer: picks, retries and attempt
// results.
func (m *metrics) observer() lbhttp.Observer {
	return lbhttp.Observer{
		OnPick:        func(service string, _ *balancer.Server) { m.service(service).picks.Inc() },
		OnRetry:       func(service string, _ error) { m.service(service).retries.Inc() },
		OnRetryDenied: func(service string) { m.service(service).denied.Inc() },
		OnResult: func(r lbhttp.Result) {
			sm := m.service(r.Service)
			sm.requests.Observe(r.Duration.Seconds())
			switch {
			case r.Err == nil:
			case r.ConnectFailure:
				sm.connectFailures.Inc()
			default:
				sm.otherFailures.Inc()
			}
		},
	}
}

// observeSubset is the Proxy's subset observer: requests per subset, for
// a canary's share. Subsets come from the configuration, so the series
// are few.
func (m *metrics) observeSubset(service, subset string) {
	m.subsets.WithLabelValues(service, subset).Inc()
}

// observeList records the apply lag of each server of lc that an event
// moved (the event's time is known for announce and offline only).
func (m *metrics) observeList(lc pushlb.ListChange) {
	for _, set := range [][]pushlb.ServerChange{lc.Joined, lc.Left} {
		for _, sc := range set {
			if !sc.EventAt.IsZero() {
				m.applyLag.WithLabelValues(string(sc.Cause)).Observe(max(lc.At.Sub(sc.EventAt).Seconds(), 0))
			}
		}
	}
}

// observeEvent is the subscriber's OnEvent hook.
func (m *metrics) observeEvent(e events.Event) {
	m.lag.Observe(max(time.Since(e.At).Seconds(), 0))
}

var (
	descReceived        = prometheus.NewDesc("pushlb_events_received_total", "Messages received on the change subjects.", nil, nil)
	descApplied         = prometheus.NewDesc("pushlb_events_applied_total", "Events that changed a service's live set.", nil, nil)
	descDropped         = prometheus.NewDesc("pushlb_events_dropped_total", "Messages dropped, by reason.", []string{"reason"}, nil)
	descDelivered       = prometheus.NewDesc("pushlb_list_deliveries_total", "Full lists handed to the balancers.", nil, nil)
	descHandlerErr      = prometheus.NewDesc("pushlb_list_delivery_errors_total", "List deliveries that failed and were retried.", nil, nil)
	descReconciles      = prometheus.NewDesc("pushlb_reconciles_total", "Reconciliations of a service with the registry.", nil, nil)
	descRemovals        = prometheus.NewDesc("pushlb_registry_removals_total", "Instances taken offline because the registry lost them (deregistered, lease expired).", nil, nil)
	descRevivals        = prometheus.NewDesc("pushlb_registry_revivals_total", "Instances a registry write brought back after an offline recorded before it (a forged offline undone, an instance that re-asserted itself).", nil, nil)
	descRefreshes       = prometheus.NewDesc("pushlb_registry_refreshes_total", "Lease refreshes seen (unchanged registry values): they cost no rebuild.", nil, nil)
	descRecreated       = prometheus.NewDesc("pushlb_registry_buckets_recreated_total", "Times the registry bucket was found lost and recreated.", nil, nil)
	descWentBack        = prometheus.NewDesc("pushlb_registry_went_back_total", "Times the registry bucket was found back in time: an older state than this gateway applied (lost acknowledged writes); later writes are ordered after what it knew.", nil, nil)
	descUnconfirmed     = prometheus.NewDesc("pushlb_unconfirmed_forgotten_total", "Instances known only from events that the registry never showed, forgotten after limits.confirmWithin.", nil, nil)
	descMalformed       = prometheus.NewDesc("pushlb_registry_malformed_total", "Registry entries skipped, by what was wrong (key, value: invalid or beyond the record limits).", []string{"part"}, nil)
	descResyncs         = prometheus.NewDesc("pushlb_registry_resyncs_total", "Full resynchronisations of the registry mirror (start, reconnects).", nil, nil)
	descLookupHit       = prometheus.NewDesc("pushlb_lookups_total", "Instance-ID lookups, by result (hit, fallback, failure; negative and rate_limited are failures answered without a registry read).", []string{"result"}, nil)
	descHeldTotal       = prometheus.NewDesc("pushlb_lists_held_total", "Lists held back because the registry lost every instance of their service at once.", nil, nil)
	descGossipGone      = prometheus.NewDesc("pushlb_gossip_removals_total", "Instances taken offline because gossip declared them dead or gone.", nil, nil)
	descGossipBack      = prometheus.NewDesc("pushlb_gossip_revivals_total", "Instances gossip brought back (refuted suspicions).", nil, nil)
	descGossipMem       = prometheus.NewDesc("pushlb_gossip_members", "Members of the gossip cluster this gateway sees, itself included.", nil, nil)
	descGossipIgnored   = prometheus.NewDesc("pushlb_gossip_ignored_total", "Gossip reports (deaths, leaves, revivals) ignored because the instance's registry record names another gossip node, or none.", nil, nil)
	descUnregistered    = prometheus.NewDesc("pushlb_lists_unregistered_total", "Lists of unknown services that named no registered instance and built no balancer.", nil, nil)
	descServicesRemoved = prometheus.NewDesc("pushlb_services_removed_total", "Balancers removed after their service had no instance and no request for the grace period.", nil, nil)
	descFollowed        = prometheus.NewDesc("pushlb_followed_services", "Services this gateway follows (mirrors and receives the events of) when scoped (follow listed or requested); 0 with follow all.", nil, nil)
	descFollows         = prometheus.NewDesc("pushlb_follows_total", "Requests for services not followed yet, by result: followed, not_found (the registry holds none; remembered 2 s), negative (answered from that memory), busy (too many follows at once), failed.", []string{"result"}, nil)
	descFollowing       = prometheus.NewDesc("pushlb_follows_in_flight", "Follows on request under way.", nil, nil)
	descUnfollows       = prometheus.NewDesc("pushlb_unfollows_total", "Services this gateway stopped following (no request for idleUnfollow, or gone from the registry).", nil, nil)
	descReaperLeader    = prometheus.NewDesc("pushlb_reaper_leader", "1 while this gateway leads the registry's reapers (it alone receives the leases' expiry messages, or the renewals on a bucket without schedules), else 0.", nil, nil)
	descReaperReaped    = prometheus.NewDesc("pushlb_reaper_removed_total", "Records this gateway's reaper removed because their lease ended (crashes not reported by gossip first).", nil, nil)
	descReaperUnled     = prometheus.NewDesc("pushlb_reaper_unled", "1 while this gateway, which may not reap, has seen no reaper lead for more than a lease: the records of crashed instances are not removed.", nil, nil)
	descRemovalsBy      = prometheus.NewDesc("pushlb_instance_removals_total", "Instances taken out of a service's list, by cause: graceful (an offline event), advisory (the NATS server's client-disconnect advisory, confirmed by a probe), gossip (declared dead or gone), lease (the record removed without an event: a lease's end, an operator).", []string{"cause"}, nil)
	descAdvState        = prometheus.NewDesc("pushlb_advisories_on", "1 while client-disconnect advisories arrive (crash detection in milliseconds), 0 when off, not checked yet or missing (crash detection falls back to gossip and leases).", nil, nil)
	descAdvReceived     = prometheus.NewDesc("pushlb_advisories_received_total", "Messages on the advisory subject.", nil, nil)
	descAdvMalformed    = prometheus.NewDesc("pushlb_advisories_malformed_total", "Messages on the advisory subject that were not client-disconnect advisories, dropped.", nil, nil)
	descAdvMatched      = prometheus.NewDesc("pushlb_advisories_matched_total", "Advisories that named the NATS connection of an instance's record (one per record).", nil, nil)
	descAdvSkipped      = prometheus.NewDesc("pushlb_advisory_probes_skipped_total", "Matched advisories not probed: a probe after an advisory of the same connection runs already, or too many run.", nil, nil)
	descAdvProbes       = prometheus.NewDesc("pushlb_advisory_probes_total", "Probes of instances whose NATS connection ended, by outcome: alive (kept), refused or unreachable (removed).", []string{"outcome"}, nil)
	descIDReleases      = prometheus.NewDesc("pushlb_id_releases_total", "While this gateway's reaper leads: the IDs of crashed instances (connection closed, probe failed) it freed for their restart, by result: released (lease ended, record removed), renamed (the record names another connection or is gone), renewed (the holder renewed its lease: alive), failed.", []string{"result"}, nil)
	descReaperEnded     = prometheus.NewDesc("pushlb_reaper_leases_ended_total", "Lease removals and expiries this gateway's reaper saw while leading.", nil, nil)
	descFailoverProbes  = prometheus.NewDesc("pushlb_registry_probes_total", "Probes of the registry stream through this gateway's NATS server (one per ping interval when its connection knows more than one server), by result: answered (by a leader with a quorum), unanswered.", []string{"result"}, nil)
	descRegionStale     = prometheus.NewDesc("pushlb_region_stale", "Per other region whose records the registry holds copies of: 1 while the copies may be out of date (the link to it is cut, or no replicator has written its status for three intervals), else 0 (docs/multiregion.md).", []string{"region"}, nil)
	descRegionCopies    = prometheus.NewDesc("pushlb_region_copies", "Per other region: how many of its records the registry holds, as its replicator last wrote.", []string{"region"}, nil)
	descRegionHeard     = prometheus.NewDesc("pushlb_region_status_age_seconds", "Per other region: seconds since its status was last written (every 5 s while a replicator leads).", []string{"region"}, nil)
	descReplWrites      = prometheus.NewDesc("pushlb_replication_copies_written_total", "While this gateway's reaper leads: copies of another region's records it wrote (added or changed) or removed, by region and op.", []string{"region", "op"}, nil)
	descReplCuts        = prometheus.NewDesc("pushlb_replication_cuts_total", "While this gateway's reaper leads: the times another region's registry stopped answering (two probes in a row), by region.", []string{"region"}, nil)
	descReplResyncs     = prometheus.NewDesc("pushlb_replication_resyncs_total", "While this gateway's reaper leads: whole reads of another region's registry (each term, each return of the link), by region.", []string{"region"}, nil)
	descReplErrors      = prometheus.NewDesc("pushlb_replication_errors_total", "While this gateway's reaper leads: failed writes of copies, and records of another region not copied (skipped), by region and kind.", []string{"region", "kind"}, nil)
	descFailoverMoves   = prometheus.NewDesc("pushlb_registry_failover_moves_total", "Moves of this gateway's NATS connection to another server of the cluster after the registry went unanswered through its server (docs/reliability.md).", nil, nil)
)

// stateCollector reads the components' own counters from the client's
// state (pushlb.Stats) at scrape time. Without st it reads the state
// itself and sends the per-service series too (serviceFamilies); a text
// scrape, which writes those itself, gives it the state it read (st).
type stateCollector struct {
	g  *Gateway
	st *pushlb.Stats
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReceived, descApplied, descDropped, descDelivered, descHandlerErr,
		descReconciles, descRemovals, descRevivals, descRefreshes, descRecreated, descWentBack, descUnconfirmed, descMalformed, descResyncs, descLookupHit, descHeldTotal, descUnregistered, descServicesRemoved, descFollowed, descFollows, descFollowing, descUnfollows, descGossipGone, descGossipBack, descGossipMem, descGossipIgnored,
		descReaperLeader, descReaperReaped, descReaperEnded, descReaperUnled, descFailoverProbes, descFailoverMoves,
		descRegionStale, descRegionCopies, descRegionHeard, descReplWrites, descReplCuts, descReplResyncs, descReplErrors,
		descRemovalsBy, descAdvState, descAdvReceived, descAdvMalformed, descAdvMatched, descAdvSkipped, descAdvProbes, descIDReleases} {
		ch <- d
	}
	if c.st == nil {
		for _, d := range serviceDescs {
			ch <- d
		}
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	flag := func(d *prometheus.Desc, on bool, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, boolValue(on), labels...)
	}
	st := c.st
	if st == nil {
		read, ok := scrapeStats(c.g)
		if !ok {
			return
		}
		st = &read
		defer collectServices(ch, st.Services)
	}
	ev := st.Events
	counter(descReceived, ev.Received)
	counter(descApplied, ev.Applied)
	for _, r := range subscriber.AllDropReasons() {
		counter(descDropped, ev.Dropped[r.String()], r.String())
	}
	counter(descDelivered, ev.Delivered)
	counter(descHandlerErr, ev.HandlerErrors)
	counter(descReconciles, ev.Reconciles)
	counter(descRemovals, ev.RegistryRemovals)
	counter(descRevivals, ev.RegistryRevivals)
	counter(descRefreshes, st.Registry.Refreshes)
	counter(descRecreated, st.Registry.BucketsRecreated)
	counter(descWentBack, st.Registry.WentBack)
	counter(descMalformed, st.Registry.MalformedKeys, "key")
	counter(descMalformed, st.Registry.MalformedValues, "value")
	counter(descUnconfirmed, ev.Unconfirmed)
	counter(descResyncs, st.Registry.Syncs)
	counter(descRemovalsBy, ev.OfflineRemovals, "graceful")
	counter(descRemovalsBy, st.Advisories.Removals, "advisory")
	counter(descRemovalsBy, ev.GossipRemovals, "gossip")
	counter(descRemovalsBy, ev.RegistryRemovals, "lease")
	adv := st.Advisories
	on := 0
	if adv.State == string(subscriber.AdvisoriesOn) {
		on = 1
	}
	gauge(descAdvState, on)
	counter(descAdvReceived, adv.Received)
	counter(descAdvMalformed, adv.Malformed)
	counter(descAdvMatched, adv.Matched)
	counter(descAdvSkipped, adv.Skipped)
	for _, o := range subscriber.AllProbeOutcomes() {
		counter(descAdvProbes, adv.Probes[o.String()], o.String())
	}
	for _, o := range subscriber.AllReleaseOutcomes() {
		counter(descIDReleases, adv.Releases[o.String()], o.String())
	}
	counter(descGossipGone, ev.GossipRemovals)
	counter(descGossipBack, ev.GossipRevivals)
	if c.g.cfg.Gossip.Enabled() {
		gauge(descGossipMem, st.Gossip.Members)
		counter(descGossipIgnored, st.Gossip.Ignored)
	}
	flag(descReaperLeader, st.Reaper.Leader)
	flag(descReaperUnled, st.Reaper.Unled)
	counter(descReaperReaped, st.Reaper.Reaped)
	counter(descReaperEnded, st.Reaper.LeasesEnded)
	counter(descFailoverProbes, st.Failover.Answered, "answered")
	counter(descFailoverProbes, st.Failover.Unanswered, "unanswered")
	counter(descFailoverMoves, st.Failover.Moves)
	for _, r := range st.Regions {
		flag(descRegionStale, r.Stale, r.Region)
		gauge(descRegionCopies, int(r.Copies), r.Region)
		ch <- prometheus.MustNewConstMetric(descRegionHeard, prometheus.GaugeValue, time.Since(r.Heard).Seconds(), r.Region)
	}
	for _, r := range st.Replication.Remotes {
		counter(descReplWrites, r.Written, r.Region, "written")
		counter(descReplWrites, r.Removed, r.Region, "removed")
		counter(descReplCuts, r.Cuts, r.Region)
		counter(descReplResyncs, r.Resyncs, r.Region)
		counter(descReplErrors, r.Errors, r.Region, "write")
		counter(descReplErrors, r.Skipped, r.Region, "skipped")
	}
	counter(descLookupHit, st.Lookups.Hits, "hit")
	counter(descLookupHit, st.Lookups.Fallbacks, "fallback")
	counter(descLookupHit, st.Lookups.Failures, "failure")
	counter(descLookupHit, st.Lookups.NegativeHits, "negative")
	counter(descLookupHit, st.Lookups.RateLimited, "rate_limited")
	counter(descUnregistered, st.Unregistered)
	counter(descServicesRemoved, st.ServicesRemoved)
	fs := st.Follow
	gauge(descFollowed, fs.Followed)
	gauge(descFollowing, fs.Following)
	counter(descUnfollows, fs.Unfollows)
	for _, r := range []struct {
		label string
		v     uint64
	}{{"followed", fs.Follows}, {"not_found", fs.NotFound}, {"negative", fs.NegativeHits}, {"busy", fs.Busy}, {"failed", fs.Failed}} {
		counter(descFollows, r.v, r.label)
	}
	counter(descHeldTotal, st.ListsHeld)
}

// boolValue is 1 for true, 0 for false.
func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// forgetServices deletes the request series of services the client no
// longer has (removed after their grace period), so /metrics does not grow
// with every service that ever existed.
func (m *metrics) forgetServices(live map[string]bool) {
	m.services.Range(func(k, _ any) bool {
		name := k.(string)
		if !live[name] {
			m.services.Delete(name)
			m.picks.DeleteLabelValues(name)
			m.retries.DeleteLabelValues(name)
			m.denied.DeleteLabelValues(name)
			m.failures.DeleteLabelValues(name, "connect")
			m.failures.DeleteLabelValues(name, "other")
			m.requests.DeleteLabelValues(name)
			m.subsets.DeletePartialMatch(prometheus.Labels{"service": name})
		}
		return true
	})
}
