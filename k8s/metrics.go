package pushlbk8s

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats are the bridge's counters since New. Safe to read at any time.
type Stats struct {
	// Malformed counts malformed objects skipped (each reconciliation
	// that meets one counts it again).
	Malformed uint64
	// Writes counts registry writes: creations, updates and removals of
	// records (renewals are counted in Renewals).
	Writes uint64
	// Renewals counts lease renewals (re-puts of unchanged records).
	Renewals uint64
	// Foreign counts records the bridge found held by another owner and
	// left alone.
	Foreign uint64
	// Errors counts failed registry writes (retried by the workqueue).
	Errors uint64
	// Reconciles counts reconciliations of a Service.
	Reconciles uint64
	// Terms counts the leadership terms this replica started.
	Terms uint64
	// Leading says whether this replica leads now.
	Leading bool
}

// metrics holds the counters and their Prometheus form.
type metrics struct {
	malformed, writes, renewals, foreign, errors, reconciles, terms atomic.Uint64
	leading                                                         atomic.Bool

	malformedVec *prometheus.CounterVec
	writesVec    *prometheus.CounterVec
	foreignC     prometheus.Counter
	errorsC      prometheus.Counter
	leadingG     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		malformedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_k8s_malformed_total", Help: "Malformed Kubernetes objects skipped, by reason.",
		}, []string{"reason"}),
		writesVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_k8s_registry_writes_total", Help: "Registry writes of the bridge, by operation (create, update, delete, renew).",
		}, []string{"op"}),
		foreignC: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pushlb_k8s_foreign_records_total", Help: "Records found held by another owner and left alone.",
		}),
		errorsC: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pushlb_k8s_registry_errors_total", Help: "Failed registry writes.",
		}),
		leadingG: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pushlb_k8s_leader", Help: "1 while this replica leads (writes the registry).",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.malformedVec, m.writesVec, m.foreignC, m.errorsC, m.leadingG} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *metrics) malformedInc(reason string) {
	m.malformed.Add(1)
	m.malformedVec.WithLabelValues(reason).Inc()
}

func (m *metrics) write(op string) {
	if op == "renew" {
		m.renewals.Add(1)
	} else {
		m.writes.Add(1)
	}
	m.writesVec.WithLabelValues(op).Inc()
}

func (m *metrics) foreignInc() { m.foreign.Add(1); m.foreignC.Inc() }
func (m *metrics) errorInc()   { m.errors.Add(1); m.errorsC.Inc() }

func (m *metrics) setLeading(v bool) {
	m.leading.Store(v)
	if v {
		m.leadingG.Set(1)
	} else {
		m.leadingG.Set(0)
	}
}

func (m *metrics) stats() Stats {
	return Stats{
		Malformed: m.malformed.Load(), Writes: m.writes.Load(), Renewals: m.renewals.Load(),
		Foreign: m.foreign.Load(), Errors: m.errors.Load(), Reconciles: m.reconciles.Load(),
		Terms: m.terms.Load(), Leading: m.leading.Load(),
	}
}
