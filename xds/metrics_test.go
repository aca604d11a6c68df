package pushlbxds_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	pushlbxds "github.com/pushlb/pushlb/xds"
)

// xdsSeries are the series NewCollector exposes.
var xdsSeries = []string{
	"pushlb_xds_services", "pushlb_xds_list_updates_total", "pushlb_xds_client_zones",
	"pushlb_xds_streams", "pushlb_xds_responses_total", "pushlb_xds_nacks_total",
	"pushlb_xds_dropped_instances_total", "pushlb_xds_bad_weights_total", "pushlb_xds_invalid_resources_total",
	`pushlb_xds_follows_total{result="followed"}`,
}

// TestMetrics: NewCollector, registered in a Prometheus registry served
// over HTTP, shows the server's counters as a scrape reads them: the
// service served, the open stream, the responses sent, a client's NACK,
// the list installed; and the stream's end takes the gauge back to 0.
func TestMetrics(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	testpub.AnnounceAddr(t, srv.Connect(t), "orders", "z1", "orders-1", "127.0.0.1:1")
	testutil.Eventually(t, "orders listed", func() bool { return len(c.Services()) == 1 })
	x, addr := startXDS(t, c)
	reg := prometheus.NewRegistry()
	reg.MustRegister(pushlbxds.NewCollector(x))
	page := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(page.Close)
	metric := func(series string) float64 { return testutil.Metric(nil, page.URL, series) }

	ads := openADS(t, addr, "z1")
	ads.request(resource.ClusterType, nil, nil)
	cds, _ := ads.next("the clusters")
	// The client rejects them: a NACK.
	nack := &discoverypb.DiscoveryRequest{Node: ads.node, TypeUrl: resource.ClusterType, ResponseNonce: cds.GetNonce(),
		ErrorDetail: &statuspb.Status{Message: "test: clusters rejected"}}
	if err := ads.s.Send(nack); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the NACK on the page", func() bool { return metric("pushlb_xds_nacks_total") == 1 })
	for series, want := range map[string]float64{"pushlb_xds_services": 1, "pushlb_xds_streams": 1, "pushlb_xds_client_zones": 0} {
		if got := metric(series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	for _, series := range []string{"pushlb_xds_responses_total", "pushlb_xds_list_updates_total"} {
		if got := metric(series); !(got >= 1) {
			t.Errorf("%s = %v, want 1 or more", series, got)
		}
	}
	_, body := testutil.Get(t, page.URL)
	for _, series := range xdsSeries {
		if !strings.Contains(body, "\n"+series+" ") {
			t.Errorf("the page has no %s:\n%s", series, body)
		}
	}

	if err := ads.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the stream's end on the page", func() bool { return metric("pushlb_xds_streams") == 0 })
}
