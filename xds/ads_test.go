package pushlbxds_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverypb "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
)

// validateDeep validates m with its Validate, then every message it holds,
// unpacking each Any: Validate does not look into an Any, and a Listener's
// connection manager travels in one.
func validateDeep(m proto.Message) error {
	if a, ok := m.(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("any %s: %w", a.GetTypeUrl(), err)
		}
		return validateDeep(inner)
	}
	if v, ok := m.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("%T: %w", m, err)
		}
	}
	var err error
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len() && err == nil; i++ {
				err = validateDeep(v.List().Get(i).Message().Interface())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = validateDeep(mv.Message().Interface())
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = validateDeep(v.Message().Interface())
		}
		return err == nil
	})
	return err
}

// adsStream is a raw ADS stream, state of the world, as Envoy opens one.
type adsStream struct {
	t     testing.TB
	s     discoverypb.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node  *corepb.Node
	resps chan *discoverypb.DiscoveryResponse
}

// openADS dials the server at addr; the stream ends with the test.
func openADS(t testing.TB, addr, zone string) *adsStream {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := &adsStream{t: t, s: s, node: &corepb.Node{Id: "envoy-" + zone, Locality: &corepb.Locality{Zone: zone}},
		resps: make(chan *discoverypb.DiscoveryResponse, 16)}
	go func() {
		defer close(a.resps)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			a.resps <- r
		}
	}()
	return a
}

// request asks for names of typeURL (none: every one), acknowledging
// prev (nil for the first request of the type).
func (a *adsStream) request(typeURL string, names []string, prev *discoverypb.DiscoveryResponse) {
	a.t.Helper()
	req := &discoverypb.DiscoveryRequest{Node: a.node, TypeUrl: typeURL, ResourceNames: names,
		VersionInfo: prev.GetVersionInfo(), ResponseNonce: prev.GetNonce()}
	if err := a.s.Send(req); err != nil {
		a.t.Fatal(err)
	}
}

// next returns the next response, each of its resources validated, by
// name.
func (a *adsStream) next(what string) (*discoverypb.DiscoveryResponse, map[string]proto.Message) {
	a.t.Helper()
	r := testutil.Receive(a.t, a.resps, 10*time.Second, what)
	if r == nil {
		a.t.Fatalf("%s: the stream ended", what)
	}
	return r, decode(a.t, r.GetResources())
}

// decode unpacks and validates resources, by name.
func decode(t testing.TB, rs []*anypb.Any) map[string]proto.Message {
	t.Helper()
	byName := map[string]proto.Message{}
	for _, r := range rs {
		m, err := r.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		if err := validateDeep(r); err != nil {
			t.Fatalf("an invalid resource was served: %v\n%v", err, m)
		}
		byName[cache.GetResourceName(m)] = m
	}
	return byName
}

// zonesOf returns a ClusterLoadAssignment's zones with their priorities
// and the weights of their endpoints.
func zonesOf(m proto.Message) map[string]string {
	out := map[string]string{}
	for _, l := range m.(*endpointpb.ClusterLoadAssignment).GetEndpoints() {
		var ws []uint32
		for _, e := range l.GetLbEndpoints() {
			ws = append(ws, e.GetLoadBalancingWeight().GetValue())
		}
		out[l.GetLocality().GetZone()] = fmt.Sprintf("p%d w%d %v", l.GetPriority(), l.GetLoadBalancingWeight().GetValue(), ws)
	}
	return out
}

func names(m map[string]proto.Message) []string { return slices.Sorted(maps.Keys(m)) }

// TestADSAsEnvoyUsesIt: a raw ADS stream as Envoy opens one (wildcard
// CDS, then EDS for the clusters; every resource validated): weights and
// the zone of the node show in the ClusterLoadAssignments; a list change
// sends only the service's; a service that leaves takes its Cluster and
// Listener with it; a delta stream gets the same; and with NATS lost, a
// new client still gets the last lists.
func TestADSAsEnvoyUsesIt(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{ServiceGrace: 100 * time.Millisecond})
	nc := srv.Connect(t)
	a, b := startGRPCServer(t), startGRPCServer(t)
	announceProc(t, srv.URL(), "orders", "z1", a.addr, "weight=3")
	announceProc(t, srv.URL(), "orders", "z2", b.addr)
	pu := testpub.AnnounceAddr(t, nc, "users", "z1", "users-1", "127.0.0.1:1")
	testutil.Eventually(t, "both services listed", func() bool { return len(c.Services()) == 2 })
	x, addr := startXDS(t, c)

	ads := openADS(t, addr, "z1")
	ads.request(resource.ClusterType, nil, nil)
	cds, clusters := ads.next("the clusters")
	if got := names(clusters); !slices.Equal(got, []string{"orders", "users"}) {
		t.Fatalf("clusters %v", got)
	}
	ads.request(resource.ClusterType, nil, cds) // ACK
	ads.request(resource.EndpointType, []string{"orders", "users"}, nil)
	eds, clas := ads.next("the endpoints")
	if got := zonesOf(clas["orders"]); !maps.Equal(got, map[string]string{"z1": "p0 w3 [3]", "z2": "p1 w1 [0]"}) {
		t.Fatalf("orders for a client in z1: %v", got)
	}
	ads.request(resource.EndpointType, []string{"orders", "users"}, eds) // ACK

	// Another instance of users: the next response holds users alone.
	pu2 := testpub.AnnounceAddr(t, nc, "users", "z2", "users-2", "127.0.0.1:2")
	eds, clas = ads.next("users' new list")
	if got := zonesOf(clas["users"]); len(clas) != 1 || !maps.Equal(got, map[string]string{"z1": "p0 w1 [0]", "z2": "p1 w1 [0]"}) {
		t.Fatalf("after users' addition: %v (%v)", got, names(clas))
	}
	ads.request(resource.EndpointType, []string{"orders", "users"}, eds)

	// The listener and route a grpc-go client reads, by name and wildcard.
	ads.request(resource.ListenerType, nil, nil)
	lds, listeners := ads.next("the listeners")
	if got := names(listeners); !slices.Equal(got, []string{"orders", "users"}) {
		t.Fatalf("listeners %v", got)
	}
	ads.request(resource.ListenerType, nil, lds)
	ads.request(resource.RouteType, []string{"orders"}, nil)
	rds, routes := ads.next("orders' route")
	if got := names(routes); !slices.Equal(got, []string{"orders"}) {
		t.Fatalf("routes %v", got)
	}
	ads.request(resource.RouteType, []string{"orders"}, rds)

	// A delta stream of a client without a zone.
	delta := openDelta(t, addr, "")
	delta.subscribe(resource.EndpointType, "orders")
	_, dclas := delta.next("orders over delta")
	if got := zonesOf(dclas["orders"]); !maps.Equal(got, map[string]string{"z1": "p0 w3 [3]", "z2": "p0 w1 [0]"}) {
		t.Fatalf("orders for a client without a zone: %v", got)
	}

	// users leaves: with its last instance gone and the grace period over,
	// its Listener and Cluster go (full-state types: a response without
	// them).
	for _, p := range []*publisher.Publisher{pu, pu2} {
		if err := p.Withdraw(t.Context(), "test"); err != nil {
			t.Fatal(err)
		}
	}
	subs := map[string][]string{resource.EndpointType: {"orders", "users"}, resource.RouteType: {"orders"}}
	for listenerGone, clusterGone := false, false; !listenerGone || !clusterGone; {
		r, m := ads.next("users' removal")
		ads.request(r.GetTypeUrl(), subs[r.GetTypeUrl()], r) // ACK
		switch r.GetTypeUrl() {
		case resource.ListenerType:
			listenerGone = slices.Equal(names(m), []string{"orders"})
		case resource.ClusterType:
			clusterGone = slices.Equal(names(m), []string{"orders"})
		}
	}

	// NATS lost: the client keeps its lists, and a new xDS client gets
	// them.
	srv.Shutdown()
	late := openADS(t, addr, "z2")
	late.request(resource.EndpointType, []string{"orders"}, nil)
	_, clas = late.next("orders with NATS lost")
	if got := zonesOf(clas["orders"]); !maps.Equal(got, map[string]string{"z1": "p1 w3 [3]", "z2": "p0 w1 [0]"}) {
		t.Fatalf("orders for a client in z2 with NATS lost: %v", got)
	}
	if st := x.Stats(); st.NACKs != 0 || st.Services != 1 || st.ClientZones != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// deltaStream is a raw delta ADS stream.
type deltaStream struct {
	t     testing.TB
	s     discoverypb.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	node  *corepb.Node
	resps chan *discoverypb.DeltaDiscoveryResponse
}

func openDelta(t testing.TB, addr, zone string) *deltaStream {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := discoverypb.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := &deltaStream{t: t, s: s, node: &corepb.Node{Id: "delta-" + zone, Locality: &corepb.Locality{Zone: zone}},
		resps: make(chan *discoverypb.DeltaDiscoveryResponse, 16)}
	go func() {
		defer close(d.resps)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			d.resps <- r
		}
	}()
	return d
}

func (d *deltaStream) subscribe(typeURL string, names ...string) {
	d.t.Helper()
	if err := d.s.Send(&discoverypb.DeltaDiscoveryRequest{Node: d.node, TypeUrl: typeURL, ResourceNamesSubscribe: names}); err != nil {
		d.t.Fatal(err)
	}
}

func (d *deltaStream) next(what string) (*discoverypb.DeltaDiscoveryResponse, map[string]proto.Message) {
	d.t.Helper()
	r := testutil.Receive(d.t, d.resps, 10*time.Second, what)
	if r == nil {
		d.t.Fatalf("%s: the stream ended", what)
	}
	var rs []*anypb.Any
	for _, res := range r.GetResources() {
		rs = append(rs, res.GetResource())
	}
	return r, decode(d.t, rs)
}
