package pushlbxds_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// peersLine matches the probe's line for exactly the servers addrs.
func peersLine(addrs ...string) *regexp.Regexp {
	s := slices.Clone(addrs)
	slices.Sort(s)
	return regexp.MustCompile("^peers " + regexp.QuoteMeta(strings.Join(s, ",")) + "$")
}

// TestGatewayServesXDS: the gateway of this module, a real process with
// -xds, serves a grpc-go xDS client in a process of its own configured as
// an application is, by GRPC_XDS_BOOTSTRAP_CONFIG: the client reaches the
// gRPC servers that announce processes registered, follows an addition
// and an offline, and the gateway stops cleanly.
func TestGatewayServesXDS(t *testing.T) {
	natsAddr, xdsAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	g := testutil.Start(t, bin.gateway, "-listen", testutil.FreeAddr(t), "-admin", testutil.FreeAddr(t),
		"-embedded-nats", natsAddr, "-data-dir", t.TempDir(), "-xds", xdsAddr)
	g.WaitFor(t, "xds: serving ADS", 30*time.Second)
	natsURL := "nats://" + natsAddr
	a, b := startGRPCServer(t), startGRPCServer(t)
	pa := announceProc(t, natsURL, "orders", "z1", a.addr)

	probe := exec.Command(bin.probe, "-target", "xds:///orders")
	probe.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP_CONFIG="+bootstrap(xdsAddr, "probe", ""))
	p := testutil.StartCmd(t, probe)
	p.WaitForRegexp(t, peersLine(a.addr), 20*time.Second)

	announceProc(t, natsURL, "orders", "z2", b.addr)
	p.WaitForRegexp(t, peersLine(a.addr, b.addr), 20*time.Second)
	if code := pa.Stop(t, 10*time.Second); code != 0 {
		t.Fatalf("announce exited %d", code)
	}
	p.WaitForRegexp(t, peersLine(b.addr), 20*time.Second)

	if code := g.Stop(t, 15*time.Second); code != 0 {
		t.Fatalf("gateway exited %d:\n%s", code, g.Output())
	}
	// The probe's calls go on reaching b with the control plane gone.
	after := b.calls.Load()
	testutil.Eventually(t, "calls to b after the gateway stopped", func() bool { return b.calls.Load() >= after+20 })
	if code := p.Stop(t, 10*time.Second); code != 0 {
		t.Fatalf("probe exited %d:\n%s", code, p.Output())
	}
	// No RPC failed, not even once the control plane was gone: the client
	// keeps the resources it has.
	if out := p.Output(); strings.Contains(out, "error:") {
		t.Fatalf("an RPC failed; the probe said:\n%s", out)
	}
}

// TestGatewayHelpNamesXDS: this build's gateway has -xds among the stock
// gateway's flags.
func TestGatewayHelpNamesXDS(t *testing.T) {
	p := testutil.Start(t, bin.gateway, "-h")
	if code := p.Wait(t, 10*time.Second); code != 0 {
		t.Fatalf("gateway -h exited %d:\n%s", code, p.Output())
	}
	for _, flag := range []string{"-xds address", "serve xDS", "-listen", "-nats"} {
		if !strings.Contains(p.Output(), flag) {
			t.Errorf("gateway -h does not say %q:\n%s", flag, p.Output())
		}
	}
}

// TestGatewayMetricsShowXDS: the gateway of this module, with -xds, has
// the xDS counters on its admin /metrics (a scrape, as Prometheus does):
// the service it serves, a client's open stream, the responses sent.
func TestGatewayMetricsShowXDS(t *testing.T) {
	natsAddr, xdsAddr, admin := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	g := testutil.Start(t, bin.gateway, "-listen", testutil.FreeAddr(t), "-admin", admin,
		"-embedded-nats", natsAddr, "-data-dir", t.TempDir(), "-xds", xdsAddr)
	g.WaitFor(t, "xds: serving ADS", 30*time.Second)
	a := startGRPCServer(t)
	announceProc(t, "nats://"+natsAddr, "orders", "z1", a.addr)
	probe := exec.Command(bin.probe, "-target", "xds:///orders")
	probe.Env = append(os.Environ(), "GRPC_XDS_BOOTSTRAP_CONFIG="+bootstrap(xdsAddr, "probe", ""))
	p := testutil.StartCmd(t, probe)
	p.WaitForRegexp(t, peersLine(a.addr), 20*time.Second)

	metrics := "http://" + admin + "/metrics"
	metric := func(series string) float64 { return testutil.Metric(nil, metrics, series) }
	testutil.Eventually(t, "orders served, the probe's stream open, on /metrics", func() bool {
		return metric("pushlb_xds_services") == 1 && metric("pushlb_xds_streams") == 1
	})
	if got := metric("pushlb_xds_responses_total"); !(got >= 4) { // a Listener, RouteConfiguration, Cluster, ClusterLoadAssignment
		t.Errorf("pushlb_xds_responses_total = %v, want 4 or more", got)
	}
	if got := metric("pushlb_xds_nacks_total"); got != 0 {
		t.Errorf("pushlb_xds_nacks_total = %v, want 0", got)
	}
	if code := p.Stop(t, 10*time.Second); code != 0 {
		t.Fatalf("probe exited %d:\n%s", code, p.Output())
	}
	if code := g.Stop(t, 15*time.Second); code != 0 {
		t.Fatalf("gateway exited %d:\n%s", code, g.Output())
	}
}
