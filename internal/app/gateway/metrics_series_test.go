package gateway

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// servicesCollector sends the per-service series of fixed services, as
// stateCollector sends a gateway's.
type servicesCollector []pushlb.ServiceStats

func (s servicesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range serviceDescs {
		ch <- d
	}
}

func (s servicesCollector) Collect(ch chan<- prometheus.Metric) { collectServices(ch, s) }

// TestServiceTextAsClientGolang: the per-service series written a line
// at a time read byte for byte as client_golang's text encoding of the
// same series, escapes and float forms included.
func TestServiceTextAsClientGolang(t *testing.T) {
	services := []pushlb.ServiceStats{
		{Name: "a-b_c", Servers: 3, Reachable: 2, Ejected: 1, Ejections: 12345678901234, Panic: true, BreakerTrips: 1 << 53, Updates: 7, Revision: math.MaxUint64},
		{Name: "orders", Servers: 100, Reachable: 100, Held: true, Updates: 1e6, Revision: 123456789},
		{Name: `odd"na\me` + "\n", Servers: 1},
	}
	slices.SortFunc(services, func(a, b pushlb.ServiceStats) int { return strings.Compare(a.Name, b.Name) }) // as Client.Stats sorts
	reg := prometheus.NewRegistry()
	reg.MustRegister(servicesCollector(services))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	enc := expfmt.NewEncoder(&want, expfmt.NewFormat(expfmt.TypeTextPlain))
	byName := map[string]*dto.MetricFamily{}
	for _, f := range families {
		byName[f.GetName()] = f
	}
	for _, sf := range serviceFamilies { // client_golang sorts families by name; a scrape writes them in table order
		if err := enc.Encode(byName[sf.name]); err != nil {
			t.Fatal(err)
		}
	}
	var got bytes.Buffer
	bw := bufio.NewWriter(&got)
	if err := writeServiceText(bw, services); err != nil {
		t.Fatal(err)
	}
	bw.Flush()
	if got.String() != want.String() {
		t.Fatalf("written\n%s\nclient_golang\n%s", got.String(), want.String())
	}
	got.Reset()
	if err := writeServiceText(bw, nil); err != nil || bw.Buffered() != 0 {
		t.Fatalf("no service: %d bytes, %v; want none (client_golang leaves empty families out)", bw.Buffered(), err)
	}
}

// TestMetricsFormats: a gateway's /metrics gives the same families and
// per-service values as text (plain and gzip-compressed) and as
// protobuf, the format client_golang serves alone.
func TestMetricsFormats(t *testing.T) {
	g := startGateway(t, testConfig(t))
	announce(t, g, "orders", "z1", testpub.Backend(t, "a"))
	testutil.Eventually(t, "the server", func() bool { s := g.State().Services; return len(s) == 1 && len(s[0].Servers) == 1 })

	scrape := func(accept, encoding string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, "http://"+g.AdminAddr()+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		req.Header.Set("Accept-Encoding", encoding) // set: the transport leaves the body as sent
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r io.Reader = resp.Body
		if resp.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			r = zr
		}
		body, err := io.ReadAll(r)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("scrape (Accept %q, Accept-Encoding %q): %d, %v", accept, encoding, resp.StatusCode, err)
		}
		return resp, body
	}
	parseText := func(body []byte) map[string]*dto.MetricFamily {
		t.Helper()
		p := expfmt.NewTextParser(model.LegacyValidation)
		families, err := p.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("text: %v\n%s", err, body)
		}
		return families
	}

	plainResp, plain := scrape("", "identity")
	if enc := plainResp.Header.Get("Content-Encoding"); enc != "" {
		t.Fatalf("identity scrape: Content-Encoding %q", enc)
	}
	text := parseText(plain)
	zResp, unzipped := scrape("", "gzip")
	if enc := zResp.Header.Get("Content-Encoding"); enc != "gzip" {
		t.Fatalf("gzip scrape: Content-Encoding %q", enc)
	}
	zipped := parseText(unzipped)
	pbResp, pb := scrape(`application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited`, "identity")
	if ct := pbResp.Header.Get("Content-Type"); !strings.Contains(ct, "protobuf") {
		t.Fatalf("protobuf scrape: Content-Type %q", ct)
	}
	protobuf := map[string]*dto.MetricFamily{}
	dec := expfmt.NewDecoder(bytes.NewReader(pb), expfmt.NewFormat(expfmt.TypeProtoDelim))
	for {
		var f dto.MetricFamily
		if err := dec.Decode(&f); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("protobuf: %v", err)
		}
		protobuf[f.GetName()] = &f
	}

	names := func(m map[string]*dto.MetricFamily) []string {
		out := make([]string, 0, len(m))
		for n := range m {
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
	if !slices.Equal(names(text), names(protobuf)) || !slices.Equal(names(text), names(zipped)) {
		t.Fatalf("families differ:\ntext     %v\ngzip     %v\nprotobuf %v", names(text), names(zipped), names(protobuf))
	}
	value := func(m *dto.Metric) float64 {
		if m.Counter != nil {
			return m.Counter.GetValue()
		}
		return m.Gauge.GetValue()
	}
	for _, sf := range serviceFamilies {
		for _, form := range []map[string]*dto.MetricFamily{text, zipped, protobuf} {
			f := form[sf.name]
			if f == nil || len(f.Metric) != 1 || f.Metric[0].Label[0].GetValue() != "orders" {
				t.Fatalf("%s: %v, want one series of orders", sf.name, f)
			}
		}
		if a, b := value(text[sf.name].Metric[0]), value(protobuf[sf.name].Metric[0]); a != b {
			t.Errorf("%s: %v in text, %v in protobuf", sf.name, a, b)
		}
	}
	if v := value(text["pushlb_servers"].Metric[0]); v != 1 {
		t.Fatalf("pushlb_servers{service=orders} = %v, want 1", v)
	}
}

func TestAcceptsGzip(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   bool
	}{
		{nil, false},
		{[]string{""}, false},
		{[]string{"gzip"}, true},
		{[]string{"GZIP"}, true},
		{[]string{"deflate, gzip;q=0.5"}, true},
		{[]string{"br", "gzip"}, true},
		{[]string{"gzip;q=0"}, false},
		{[]string{"gzip; q=0.000"}, false},
		{[]string{"gzip;q=0.001"}, true},
		{[]string{"*"}, true},
		{[]string{"*;q=0"}, false},
		{[]string{"gzip;q=0, *"}, false},
		{[]string{"identity"}, false},
		{[]string{"zstd, identity;q=0.5"}, false},
	} {
		if got := acceptsGzip(tc.values); got != tc.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", tc.values, got, tc.want)
		}
	}
}
