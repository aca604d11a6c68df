package gateway

import (
	"bytes"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// seriesCollector sends a scrape's series as serviceSeries (own) or as
// prometheus.MustNewConstMetric's (const).
type seriesCollector struct {
	own bool
	c   *stateCollector
}

func (s seriesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descServers
	ch <- descUpdates
}

func (s seriesCollector) Collect(ch chan<- prometheus.Metric) {
	for i, name := range []string{"orders", "a-b_c", "payments"} {
		if s.own {
			labels := s.c.labelsOf(name)
			ch <- &serviceSeries{desc: descServers, labels: labels, value: float64(i + 2), kind: prometheus.GaugeValue}
			ch <- &serviceSeries{desc: descUpdates, labels: labels, value: float64(10 * i), kind: prometheus.CounterValue}
			continue
		}
		ch <- prometheus.MustNewConstMetric(descServers, prometheus.GaugeValue, float64(i+2), name)
		ch <- prometheus.MustNewConstMetric(descUpdates, prometheus.CounterValue, float64(10*i), name)
	}
}

// expose gathers a registry holding c and encodes it as /metrics does
// (the text format).
func expose(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range families {
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.String()
}

// A service's series built as serviceSeries read exactly as const
// metrics do, scrape after scrape (the label pairs kept are shared, never
// changed); the label pairs of services gone are forgotten.
func TestServiceSeriesAsConstMetrics(t *testing.T) {
	sc := &stateCollector{labels: make(map[string][]*dto.LabelPair)}
	want := expose(t, seriesCollector{})
	for range 2 {
		if got := expose(t, seriesCollector{own: true, c: sc}); got != want {
			t.Fatalf("serviceSeries expose\n%s\nconst metrics expose\n%s", got, want)
		}
	}
	sc.forget(map[string]bool{"orders": true})
	if len(sc.labels) != 1 || sc.labels["orders"] == nil {
		t.Fatalf("label pairs kept after forget: %v, want orders' only", sc.labels)
	}
}
