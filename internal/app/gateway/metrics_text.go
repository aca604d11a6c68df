package gateway

import (
	"bufio"
	"compress/gzip"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"

	"github.com/pushlb/pushlb"
)

// The per-service series (9 a service: 9,000 at 1,000 services) are
// written straight to a text scrape, a line each, rather than built as
// client_golang's metric objects, which a scrape of 1,000 services held
// by the MB until encoded: a collection that landed in a scrape marked
// them, and the heap's next goal was twice that much higher
// (docs/perf/memory.md, "Where the goal of 100 MB ends"). A scrape that
// asks for another format (protobuf) gets them from stateCollector,
// through client_golang, with the same values.

// serviceFamily is one per-service metric: its name, help, type and
// value for a service.
type serviceFamily struct {
	name, help string
	kind       prometheus.ValueType // GaugeValue or CounterValue
	value      func(s *pushlb.ServiceStats) float64
}

// serviceFamilies are the per-service metrics, in the order a scrape
// writes them.
var serviceFamilies = []serviceFamily{
	{"pushlb_servers", "Servers listed per service.", prometheus.GaugeValue,
		func(s *pushlb.ServiceStats) float64 { return float64(s.Servers) }},
	{"pushlb_servers_reachable", "Servers a pick may choose per service: alive, with a closed circuit breaker, not ejected.", prometheus.GaugeValue,
		func(s *pushlb.ServiceStats) float64 { return float64(s.Reachable) }},
	{"pushlb_servers_ejected", "Servers outlier detection ejects now, per service.", prometheus.GaugeValue,
		func(s *pushlb.ServiceStats) float64 { return float64(s.Ejected) }},
	{"pushlb_outlier_ejections_total", "Servers ejected by outlier detection (server errors in a row), by service.", prometheus.CounterValue,
		func(s *pushlb.ServiceStats) float64 { return float64(s.Ejections) }},
	{"pushlb_panic_mode", "1 while too few of a service's servers are healthy (panicThreshold) and picks balance over all of them, else 0.", prometheus.GaugeValue,
		func(s *pushlb.ServiceStats) float64 { return boolValue(s.Panic) }},
	{"pushlb_list_held", "1 while a service's last list is kept because the registry lost all its instances at once (emptyListHold), else 0.", prometheus.GaugeValue,
		func(s *pushlb.ServiceStats) float64 { return boolValue(s.Held) }},
	{"pushlb_breaker_trips_total", "Circuit breakers tripped, by service.", prometheus.CounterValue,
		func(s *pushlb.ServiceStats) float64 { return float64(s.BreakerTrips) }},
	{"pushlb_list_updates_total", "Changes of a service's server list.", prometheus.CounterValue,
		func(s *pushlb.ServiceStats) float64 { return float64(s.Updates) }},
	{"pushlb_registry_revision", "The registry revision this gateway has applied, per service: a change written at revision r has reached the service's list once this is r or more.", prometheus.CounterValue,
		func(s *pushlb.ServiceStats) float64 { return float64(s.Revision) }},
}

// serviceDescs are serviceFamilies' descriptions, for stateCollector.
var serviceDescs = func() []*prometheus.Desc {
	out := make([]*prometheus.Desc, len(serviceFamilies))
	for i, f := range serviceFamilies {
		out[i] = prometheus.NewDesc(f.name, f.help, []string{"service"}, nil)
	}
	return out
}()

// scrapeStats reads the client's state for a scrape (its services
// sorted by name, the order client_golang gives a family's series), and
// forgets the request series of services the client no longer has
// (metrics.forgetServices); false before the client exists.
func scrapeStats(g *Gateway) (pushlb.Stats, bool) {
	if g.client == nil {
		return pushlb.Stats{}, false
	}
	st := g.client.Stats()
	live := make(map[string]bool, len(st.Services))
	for _, s := range st.Services {
		live[s.Name] = true
	}
	g.metrics.forgetServices(live)
	return st, true
}

// collectServices sends the per-service series of services.
func collectServices(ch chan<- prometheus.Metric, services []pushlb.ServiceStats) {
	for i, f := range serviceFamilies {
		for j := range services {
			ch <- prometheus.MustNewConstMetric(serviceDescs[i], f.kind, f.value(&services[j]), services[j].Name)
		}
	}
}

// writeServiceText writes the per-service series of services (sorted by
// name) in the text format, as client_golang's encoder writes them.
func writeServiceText(w *bufio.Writer, services []pushlb.ServiceStats) error {
	if len(services) == 0 {
		return nil // client_golang leaves out a family without series
	}
	var line []byte
	for _, f := range serviceFamilies {
		typ := "gauge"
		if f.kind == prometheus.CounterValue {
			typ = "counter"
		}
		line = append(line[:0], "# HELP "...)
		line = append(line, f.name...)
		line = append(line, ' ')
		line = appendEscaped(line, f.help, false)
		line = append(line, "\n# TYPE "...)
		line = append(line, f.name...)
		line = append(line, ' ')
		line = append(line, typ...)
		line = append(line, '\n')
		if _, err := w.Write(line); err != nil {
			return err
		}
		for i := range services {
			line = append(line[:0], f.name...)
			line = append(line, `{service="`...)
			line = appendEscaped(line, services[i].Name, true)
			line = append(line, `"} `...)
			line = appendFloat(line, f.value(&services[i]))
			line = append(line, '\n')
			if _, err := w.Write(line); err != nil {
				return err
			}
		}
	}
	return nil
}

// appendEscaped appends s escaped as the text format escapes a help text
// (backslash, line feed) or, with quote, a label value (and '"').
func appendEscaped(b []byte, s string, quote bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quote:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// appendFloat appends v as the text format writes a sample's value.
func appendFloat(b []byte, v float64) []byte {
	switch {
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// handler serves /metrics: the text format (what a scrape without an
// Accept header, or one that prefers text, gets) with the per-service
// series written a line at a time, gzip-compressed when the scrape
// accepts it; any other format through client_golang's handler, the
// per-service series included. The compressor is each scrape's own:
// client_golang's pool kept one (some 800 KB) live between scrapes.
func (m *metrics) handler(g *Gateway) http.Handler {
	other := promhttp.HandlerFor(prometheus.Gatherers{m.reg, m.stateReg}, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		format := expfmt.Negotiate(r.Header)
		if format.FormatType() != expfmt.TypeTextPlain {
			other.ServeHTTP(w, r)
			return
		}
		// The client's state is read once: its counters go through
		// client_golang, its services are written below.
		gatherers := prometheus.Gatherers{m.reg}
		st, ok := scrapeStats(g)
		if ok {
			state := prometheus.NewRegistry()
			state.MustRegister(&stateCollector{g: g, st: &st})
			gatherers = append(gatherers, state)
		}
		families, err := gatherers.Gather()
		if err != nil {
			http.Error(w, "An error has occurred while serving metrics:\n\n"+err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", string(format))
		h.Add("Vary", "Accept-Encoding")
		var out io.Writer = w
		if acceptsGzip(r.Header.Values("Accept-Encoding")) {
			h.Set("Content-Encoding", "gzip")
			zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed) // a valid level: no error
			defer zw.Close()
			out = zw
		}
		bw := bufio.NewWriterSize(out, 32<<10)
		enc := expfmt.NewEncoder(bw, format)
		for _, f := range families {
			if err := enc.Encode(f); err != nil {
				return // the client went away: nothing to tell it
			}
		}
		if writeServiceText(bw, st.Services) == nil {
			bw.Flush()
		}
	})
}

// acceptsGzip reports whether the Accept-Encoding values accept gzip: it
// is named with a non-zero quality, or not named and * is.
func acceptsGzip(values []string) bool {
	gzipQ, starQ := "", ""
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			q := "1"
			if v, ok := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q="); ok {
				q = v
			}
			switch strings.ToLower(strings.TrimSpace(coding)) {
			case "gzip":
				gzipQ = q
			case "*":
				starQ = q
			}
		}
	}
	if gzipQ != "" {
		return !isZeroQuality(gzipQ)
	}
	return starQ != "" && !isZeroQuality(starQ)
}

// isZeroQuality reports whether q, a quality value ("0", "0.0", "0.000"),
// is zero.
func isZeroQuality(q string) bool {
	frac, ok := strings.CutPrefix(q, "0")
	return ok && (frac == "" || frac[0] == '.') && strings.Trim(strings.TrimPrefix(frac, "."), "0") == ""
}
