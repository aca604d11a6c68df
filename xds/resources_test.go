package pushlbxds

import (
	"maps"
	"slices"
	"strings"
	"testing"

	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routerpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttppb "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	"github.com/pushlb/pushlb/balancer"
)

func server(id, host string, port int, zone string, meta map[string]string) *balancer.Server {
	return &balancer.Server{ID: id, Host: host, Port: port, Zone: zone, Metadata: meta}
}

// locality is what a test reads of a LocalityLbEndpoints.
type locality struct {
	zone     string
	priority uint32
	weight   uint32
	addrs    []string
	weights  []uint32 // 0: no weight set
}

func localities(cla *endpointpb.ClusterLoadAssignment) []locality {
	var ls []locality
	for _, l := range cla.GetEndpoints() {
		got := locality{zone: l.GetLocality().GetZone(), priority: l.GetPriority(), weight: l.GetLoadBalancingWeight().GetValue()}
		for _, e := range l.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			got.addrs = append(got.addrs, sa.GetAddress()+":"+itoa(sa.GetPortValue()))
			got.weights = append(got.weights, e.GetLoadBalancingWeight().GetValue())
		}
		ls = append(ls, got)
	}
	return ls
}

func itoa(n uint32) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
		if n == 0 {
			return string(b)
		}
	}
}

func equalLocalities(a, b []locality) bool {
	return slices.EqualFunc(a, b, func(x, y locality) bool {
		return x.zone == y.zone && x.priority == y.priority && x.weight == y.weight &&
			slices.Equal(x.addrs, y.addrs) && slices.Equal(x.weights, y.weights)
	})
}

// The ClusterLoadAssignment of a list: a locality per zone, sorted, the
// client's zone first, weights from metadata, duplicates and bad input
// left out; every one passes Validate and grpc-go's rules (priorities
// from 0 without a gap, no weight 0, no duplicate address).
func TestLoadAssignment(t *testing.T) {
	list := []*balancer.Server{
		server("a1", "10.0.0.1", 9001, "z1", nil),
		server("b1", "10.0.0.2", 9001, "Z2", map[string]string{"weight": "3"}),
		server("a2", "10.0.0.3", 9001, "Z1", map[string]string{"weight": "2"}),
		server("b2", "10.0.0.4", 9001, "z2", nil),
	}
	both := func(p1, p2 uint32) []locality {
		return []locality{
			{zone: "z1", priority: p1, weight: 3, addrs: []string{"10.0.0.1:9001", "10.0.0.3:9001"}, weights: []uint32{0, 2}},
			{zone: "Z2", priority: p2, weight: 4, addrs: []string{"10.0.0.2:9001", "10.0.0.4:9001"}, weights: []uint32{3, 0}},
		}
	}
	for _, tc := range []struct {
		name       string
		list       []*balancer.Server
		clientZone string
		want       []locality
		drops      []string
	}{
		{name: "no client zone: one priority", list: list, want: both(0, 0)},
		{name: "client in z1", list: list, clientZone: "z1", want: both(0, 1)},
		{name: "client in z2, another case", list: list, clientZone: "z2", want: both(1, 0)},
		{name: "client of a zone the service lacks", list: list, clientZone: "z9", want: both(0, 0)},
		{name: "empty list", list: nil, clientZone: "z1", want: nil},
		{name: "default zone", list: []*balancer.Server{server("x", "10.0.0.9", 80, "", nil)}, clientZone: "z1",
			want: []locality{{zone: "", weight: 1, addrs: []string{"10.0.0.9:80"}, weights: []uint32{0}}}},
		{name: "bad weights are ignored", clientZone: "", list: []*balancer.Server{
			server("w0", "10.0.0.1", 1, "z", map[string]string{"weight": "0"}),
			server("wneg", "10.0.0.2", 1, "z", map[string]string{"weight": "-1"}),
			server("wbig", "10.0.0.3", 1, "z", map[string]string{"weight": "10001"}),
			server("wtext", "10.0.0.4", 1, "z", map[string]string{"weight": "heavy"}),
			server("wmax", "10.0.0.5", 1, "z", map[string]string{"weight": "10000"}),
		}, want: []locality{{zone: "z", weight: 10004,
			addrs:   []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1", "10.0.0.5:1"},
			weights: []uint32{0, 0, 0, 0, 10000}}}},
		{name: "record weights win, others default to 100", clientZone: "", list: []*balancer.Server{
			{ID: "r300", Host: "10.0.0.1", Port: 1, Zone: "z", Weight: 300, Metadata: map[string]string{"weight": "7"}},
			server("none", "10.0.0.2", 1, "z", nil),
			server("meta", "10.0.0.3", 1, "z", map[string]string{"weight": "7"}),
			server("bad", "10.0.0.4", 1, "z", map[string]string{"weight": "heavy"}),
		}, want: []locality{{zone: "z", weight: 507,
			addrs:   []string{"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"},
			weights: []uint32{300, 100, 7, 100}}}},
		{name: "a duplicate address is left out", list: []*balancer.Server{
			server("old", "10.0.0.1", 1, "z1", nil),
			server("new", "10.0.0.1", 1, "z2", nil),
			server("other", "10.0.0.2", 1, "z2", nil),
		}, clientZone: "z1", want: []locality{
			{zone: "z1", weight: 1, addrs: []string{"10.0.0.1:1"}, weights: []uint32{0}},
			{zone: "z2", priority: 1, weight: 1, addrs: []string{"10.0.0.2:1"}, weights: []uint32{0}},
		}, drops: []string{"new"}},
		{name: "no host", list: []*balancer.Server{server("nohost", "", 1, "z", nil)}, want: nil, drops: []string{"nohost"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cla, drops, err := loadAssignmentFor("orders", endpoints(tc.list), localityOf("", tc.clientZone), nil)
			if err != nil {
				t.Fatal(err)
			}
			if cla.GetClusterName() != "orders" {
				t.Fatalf("cluster name %q", cla.GetClusterName())
			}
			if got := localities(cla); !equalLocalities(got, tc.want) {
				t.Fatalf("localities\n got %+v\nwant %+v", got, tc.want)
			}
			var ids []string
			for _, d := range drops {
				ids = append(ids, d.id)
			}
			if !slices.Equal(ids, tc.drops) {
				t.Fatalf("dropped %v, want %v", drops, tc.drops)
			}
			checkGRPCRules(t, cla)
			for _, l := range cla.GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					if e.GetHealthStatus().String() != "HEALTHY" {
						t.Fatalf("health %v", e.GetHealthStatus())
					}
					if id := e.GetMetadata().GetFilterMetadata()[MetadataKey].GetFields()["instanceId"].GetStringValue(); id == "" {
						t.Fatalf("endpoint without its instance ID: %v", e)
					}
				}
			}
		})
	}
	// The bad weights are reported for the log.
	var bad []string
	for _, e := range endpoints([]*balancer.Server{server("w", "h", 1, "", map[string]string{"weight": "x"}), server("ok", "h", 2, "", nil)}) {
		if e.badValue != "" {
			bad = append(bad, e.id)
		}
	}
	if !slices.Equal(bad, []string{"w"}) {
		t.Fatalf("bad weights %v", bad)
	}
}

// checkGRPCRules checks what grpc-go's EDS parser rejects a resource for
// (internal/xds/xdsclient/xdsresource/unmarshal_eds.go), and Validate.
func checkGRPCRules(t *testing.T, cla *endpointpb.ClusterLoadAssignment) {
	t.Helper()
	if err := cla.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	priorities := map[uint32]bool{}
	addrs := map[string]bool{}
	for _, l := range cla.GetEndpoints() {
		if l.GetLocality() == nil || l.GetLoadBalancingWeight().GetValue() == 0 {
			t.Fatalf("locality without ID or weight: %v", l)
		}
		priorities[l.GetPriority()] = true
		for _, e := range l.GetLbEndpoints() {
			if w := e.GetLoadBalancingWeight(); w != nil && w.GetValue() == 0 {
				t.Fatalf("endpoint weight 0: %v", e)
			}
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			a := sa.GetAddress() + ":" + itoa(sa.GetPortValue())
			if addrs[a] {
				t.Fatalf("duplicate address %s", a)
			}
			addrs[a] = true
		}
	}
	for i := range uint32(len(priorities)) {
		if !priorities[i] {
			t.Fatalf("priorities %v: %d missing", priorities, i)
		}
	}
}

// The Listener, RouteConfiguration and Cluster of a service pass Validate,
// and so do the messages they carry in an Any; they chain by the
// service's name as grpc-go's xDS client follows them.
func TestServiceResources(t *testing.T) {
	l, err := listenerFor("orders")
	if err != nil {
		t.Fatal(err)
	}
	var hcm hcmpb.HttpConnectionManager
	if err := l.GetApiListener().GetApiListener().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	if err := hcm.Validate(); err != nil {
		t.Fatal(err)
	}
	if hcm.GetRds().GetRouteConfigName() != "orders" || hcm.GetRds().GetConfigSource().GetAds() == nil {
		t.Fatalf("RDS %v", hcm.GetRds())
	}
	filters := hcm.GetHttpFilters()
	var router routerpb.Router
	if len(filters) != 1 || filters[0].GetTypedConfig().UnmarshalTo(&router) != nil {
		t.Fatalf("filters %v: want the router alone", filters)
	}
	r, err := routeFor("orders")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetCluster(); got != "orders" {
		t.Fatalf("route to %q", got)
	}
	for _, http2 := range []bool{false, true} {
		c, err := clusterFor("orders", http2)
		if err != nil {
			t.Fatal(err)
		}
		if c.GetType().String() != "EDS" || c.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil || c.GetLbPolicy().String() != "ROUND_ROBIN" {
			t.Fatalf("cluster %v", c)
		}
		opts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if (opts != nil) != http2 {
			t.Fatalf("http2 %v: protocol options %v", http2, opts)
		}
		if opts != nil {
			var po upstreamhttppb.HttpProtocolOptions
			if err := opts.UnmarshalTo(&po); err != nil || po.Validate() != nil || po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
				t.Fatalf("protocol options %v: %v", &po, err)
			}
		}
	}
	// A name Validate refuses is an error, not a resource.
	if _, err := routeFor(""); err == nil || !strings.Contains(err.Error(), "Name") {
		t.Fatalf("routeFor(\"\"): %v", err)
	}
}

// Regions: a client that names its region gets its zone first, its
// region's other zones next, then the listed regions in order, then the
// others by name, each a priority of its own; one without a region
// ignores them.
func TestLoadAssignmentRegions(t *testing.T) {
	at := func(id, host, region, zone string) *balancer.Server {
		return &balancer.Server{ID: id, Host: host, Port: 80, Region: region, Zone: zone}
	}
	list := []*balancer.Server{
		at("eu1", "10.0.0.1", "eu", "eu-a"),
		at("eu2", "10.0.0.2", "EU", "eu-b"),
		at("us1", "10.0.1.1", "us", "us-a"),
		at("ap1", "10.0.2.1", "ap", "ap-a"),
		at("sa1", "10.0.3.1", "sa", "sa-a"),
		at("old", "10.0.0.3", "", "eu-b"), // announced before regions: the registry's own
	}
	priorities := func(loc clientLocality, priority ...string) map[string]uint32 {
		t.Helper()
		cla, _, err := loadAssignmentFor("orders", endpoints(list), loc, priority)
		if err != nil {
			t.Fatal(err)
		}
		checkGRPCRules(t, cla)
		out := map[string]uint32{}
		for _, l := range cla.GetEndpoints() {
			out[l.GetLocality().GetRegion()+"/"+l.GetLocality().GetZone()] = l.GetPriority()
		}
		return out
	}
	got := priorities(localityOf("eu", "EU-B"), "sa")
	want := map[string]uint32{"EU/eu-b": 0, "/eu-b": 0, "eu/eu-a": 1, "sa/sa-a": 2, "ap/ap-a": 3, "us/us-a": 4}
	if !maps.Equal(got, want) {
		t.Errorf("client eu/eu-b, priority [sa]:\n got %v\nwant %v", got, want)
	}
	got = priorities(localityOf("us", ""))
	want = map[string]uint32{"us/us-a": 0, "/eu-b": 0, "ap/ap-a": 1, "EU/eu-b": 2, "eu/eu-a": 2, "sa/sa-a": 3}
	if !maps.Equal(got, want) {
		t.Errorf("client us, no zone:\n got %v\nwant %v", got, want)
	}
	got = priorities(localityOf("", "eu-a"))
	for l, p := range got {
		if want := uint32(1); l != "eu/eu-a" && p != want || l == "eu/eu-a" && p != 0 {
			t.Errorf("client without a region, zone eu-a: %s at %d; want eu-a 0, the rest 1 (%v)", l, p, got)
		}
	}
}
