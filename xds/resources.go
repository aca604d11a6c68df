package pushlbxds

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	clusterpb "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointpb "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerpb "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttppb "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/pushlb/pushlb/balancer"
)

// WeightKey is the metadata key of an instance's weight: a whole number
// from 1 to MaxWeight ("announce -meta weight=3"). The record's weight
// ("announce -weight N", balancer.Server.Weight) wins over it; see
// endpoints. An instance without either
// has no weight in its endpoint (every endpoint then counts as 1); any
// other value is logged, counted (Stats.BadWeights) and ignored.
const WeightKey = "weight"

// MaxWeight is the greatest instance weight. It keeps the sum of a zone's
// weights, which xDS bounds at 2^32-1, in range for 400,000 instances.
const MaxWeight = 10000

// MetadataKey is the filter-metadata namespace of each endpoint: it holds
// the instance's pushlb ID ("instanceId"), for Envoy's access logs
// (%UPSTREAM_METADATA(["pushlb", "instanceId"])%) and for debugging.
const MetadataKey = "pushlb"

// endpoint is one instance as the resources need it: read from the
// balancer's server when its list arrives, so that building resources
// later reads nothing shared.
type endpoint struct {
	id        string
	host      string
	port      uint32
	zone      string // as announced
	zoneKey   string // lower case: zones compare without regard to case
	region    string // as announced; "" for the registry's own
	regionKey string
	weight    uint32 // 0: none announced
	badValue  string // a weight that was ignored, for the log
}

// endpoints converts a balancer's list. An endpoint's weight is its
// record's (balancer.Server.Weight, 1 to 1,000) when set; otherwise the
// metadata key WeightKey's, when valid; otherwise, when another instance
// of the list has a record weight, the default record weight (100), so
// that instances announced without a weight weigh what pushlb's own
// balancers give them; otherwise none.
func endpoints(servers []*balancer.Server) []endpoint {
	recordWeights := false
	for _, s := range servers {
		if s.Weight != 0 {
			recordWeights = true
			break
		}
	}
	eps := make([]endpoint, 0, len(servers))
	for _, s := range servers {
		e := endpoint{id: s.ID, host: s.Host, port: uint32(s.Port), zone: s.Zone, zoneKey: strings.ToLower(s.Zone), region: s.Region, regionKey: strings.ToLower(s.Region)}
		if s.Weight != 0 {
			e.weight = uint32(s.EffectiveWeight())
		} else if v, ok := s.Metadata[WeightKey]; ok {
			if w, err := strconv.ParseUint(v, 10, 32); err == nil && w >= 1 && w <= MaxWeight {
				e.weight = uint32(w)
			} else {
				e.badValue = v
			}
		}
		if e.weight == 0 && recordWeights {
			e.weight = balancer.DefaultWeight
		}
		eps = append(eps, e)
	}
	return eps
}

// adsSource is the config source "the ADS stream these resources came on".
func adsSource() *corepb.ConfigSource {
	return &corepb.ConfigSource{
		ResourceApiVersion:    corepb.ApiVersion_V3,
		ConfigSourceSpecifier: &corepb.ConfigSource_Ads{Ads: &corepb.AggregatedConfigSource{}},
	}
}

// validator is what protoc-gen-validate generates for every resource.
type validator interface{ Validate() error }

// typedAny validates m and wraps it in an Any. Validate does not look into
// an Any, so every message that travels in one is validated here.
func typedAny(m interface {
	proto.Message
	validator
}) (*anypb.Any, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return anypb.New(m)
}

// listenerFor returns the service's Listener: an API listener (the kind
// grpc-go's xDS client reads for "xds:///<service>") whose HTTP
// connection manager takes its routes from the RouteConfiguration of the
// same name over ADS.
func listenerFor(service string) (*listenerpb.Listener, error) {
	router, err := typedAny(&routerpb.Router{})
	if err != nil {
		return nil, fmt.Errorf("router filter: %w", err)
	}
	hcm, err := typedAny(&hcmpb.HttpConnectionManager{
		StatPrefix: service,
		RouteSpecifier: &hcmpb.HttpConnectionManager_Rds{Rds: &hcmpb.Rds{
			ConfigSource:    adsSource(),
			RouteConfigName: service,
		}},
		HttpFilters: []*hcmpb.HttpFilter{{
			Name:       wellknown.Router,
			ConfigType: &hcmpb.HttpFilter_TypedConfig{TypedConfig: router},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("http connection manager: %w", err)
	}
	l := &listenerpb.Listener{Name: service, ApiListener: &listenerpb.ApiListener{ApiListener: hcm}}
	return l, l.Validate()
}

// routeFor returns the service's RouteConfiguration: every path of every
// authority to the cluster of the same name.
func routeFor(service string) (*routepb.RouteConfiguration, error) {
	r := &routepb.RouteConfiguration{
		Name: service,
		VirtualHosts: []*routepb.VirtualHost{{
			Name:    service,
			Domains: []string{"*"},
			Routes: []*routepb.Route{{
				Match: &routepb.RouteMatch{PathSpecifier: &routepb.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routepb.Route_Route{Route: &routepb.RouteAction{
					ClusterSpecifier: &routepb.RouteAction_Cluster{Cluster: service},
				}},
			}},
		}},
	}
	return r, r.Validate()
}

// clusterFor returns the service's Cluster: its endpoints from the
// ClusterLoadAssignment of the same name over ADS, round robin. With
// http2, the cluster says its instances speak HTTP/2 (what Envoy needs in
// front of gRPC servers; grpc-go ignores it).
func clusterFor(service string, http2 bool) (*clusterpb.Cluster, error) {
	c := &clusterpb.Cluster{
		Name:                 service,
		ClusterDiscoveryType: &clusterpb.Cluster_Type{Type: clusterpb.Cluster_EDS},
		EdsClusterConfig:     &clusterpb.Cluster_EdsClusterConfig{EdsConfig: adsSource()},
		LbPolicy:             clusterpb.Cluster_ROUND_ROBIN,
	}
	if http2 {
		opts, err := typedAny(&upstreamhttppb.HttpProtocolOptions{
			UpstreamProtocolOptions: &upstreamhttppb.HttpProtocolOptions_ExplicitHttpConfig_{
				ExplicitHttpConfig: &upstreamhttppb.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &upstreamhttppb.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
						Http2ProtocolOptions: &corepb.Http2ProtocolOptions{},
					},
				},
			},
		})
		if err != nil {
			return nil, fmt.Errorf("http protocol options: %w", err)
		}
		c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts,
		}
	}
	return c, c.Validate()
}

// dropped is an instance left out of a ClusterLoadAssignment, with why.
type dropped struct {
	id, reason string
}

// clientLocality is where an xDS client runs, from its node's locality:
// its region and zone, lower case (they compare without regard to case).
// The ClusterLoadAssignments' priorities depend on it.
type clientLocality struct{ region, zone string }

func localityOf(region, zone string) clientLocality {
	return clientLocality{strings.ToLower(region), strings.ToLower(zone)}
}

// String is the locality for logs: "zone", or "region/zone".
func (l clientLocality) String() string {
	if l.region == "" {
		return l.zone
	}
	return l.region + "/" + l.zone
}

// loadAssignmentFor returns the service's ClusterLoadAssignment as a
// client at loc sees it: one locality per region and zone (sorted by
// region, then zone), every endpoint HEALTHY (the list holds the live
// instances only), with its weight when it announced one. The locality's
// weight is the sum of its endpoints' (1 each without one), so that
// clients split the load between zones by capacity.
//
// Priorities, Envoy's locality failover (lower first, contiguous from 0):
//   - regions, when the client names its region: its own region's
//     localities (those of endpoints without a region too), then the
//     regions of regionPriority in order, then the others by name; a
//     client without a region ignores the endpoints' regions;
//   - within the nearest level, when the client's zone has endpoints
//     there: that zone's locality first, the other zones of its region
//     next.
//
// So a client stays in its zone, then its region, and fails over level by
// level when the nearer ones have no instance left or none it can reach.
//
// An instance whose address another instance already has (an ID re-used
// by a restart with another ID while the old record lingers) is left out,
// as is one with no host or port: both would make the whole resource
// rejected by grpc-go. The dropped instances are returned.
func loadAssignmentFor(service string, eps []endpoint, loc clientLocality, regionPriority []string) (*endpointpb.ClusterLoadAssignment, []dropped, error) {
	type locality struct {
		region, zone       string
		regionKey, zoneKey string
		weight             uint64
		endpoints          []*endpointpb.LbEndpoint
	}
	type key struct{ region, zone string }
	var (
		byKey = map[key]*locality{}
		addrs = map[string]string{} // address -> instance ID
		drops []dropped
	)
	for _, e := range eps {
		if e.host == "" || e.port == 0 || e.port > 65535 {
			drops = append(drops, dropped{e.id, "no host or port"})
			continue
		}
		addr := net.JoinHostPort(e.host, strconv.Itoa(int(e.port)))
		if other, ok := addrs[addr]; ok {
			drops = append(drops, dropped{e.id, "address " + addr + " is also instance " + other + "'s"})
			continue
		}
		addrs[addr] = e.id
		k := key{e.regionKey, e.zoneKey}
		l := byKey[k]
		if l == nil {
			l = &locality{region: e.region, zone: e.zone, regionKey: e.regionKey, zoneKey: e.zoneKey}
			byKey[k] = l
		}
		lb := &endpointpb.LbEndpoint{
			HostIdentifier: &endpointpb.LbEndpoint_Endpoint{Endpoint: &endpointpb.Endpoint{
				Address: &corepb.Address{Address: &corepb.Address_SocketAddress{SocketAddress: &corepb.SocketAddress{
					Protocol:      corepb.SocketAddress_TCP,
					Address:       e.host,
					PortSpecifier: &corepb.SocketAddress_PortValue{PortValue: e.port},
				}}},
			}},
			HealthStatus: corepb.HealthStatus_HEALTHY,
			Metadata: &corepb.Metadata{FilterMetadata: map[string]*structpb.Struct{
				MetadataKey: {Fields: map[string]*structpb.Value{"instanceId": structpb.NewStringValue(e.id)}},
			}},
		}
		w := uint64(1)
		if e.weight > 0 {
			lb.LoadBalancingWeight = wrapperspb.UInt32(e.weight)
			w = uint64(e.weight)
		}
		l.weight += w
		l.endpoints = append(l.endpoints, lb)
	}
	localities := make([]*locality, 0, len(byKey))
	for _, l := range byKey {
		localities = append(localities, l)
	}
	slices.SortFunc(localities, func(a, b *locality) int {
		return cmp.Or(cmp.Compare(a.regionKey, b.regionKey), cmp.Compare(a.zoneKey, b.zoneKey))
	})

	// The level of each locality: (region tier, zone preference); the
	// tiers in the order pushlb's balancers fail over in.
	order := balancer.RegionOrder(loc.region, regionPriority)
	var regions []string // one region key per tier, nearest first
	for _, l := range localities {
		if !slices.ContainsFunc(regions, func(r string) bool { return order(r, l.regionKey) == 0 }) {
			regions = append(regions, l.regionKey)
		}
	}
	slices.SortStableFunc(regions, order)
	tier := func(l *locality) int {
		return slices.IndexFunc(regions, func(r string) bool { return order(r, l.regionKey) == 0 })
	}
	zonePreferred := false
	if loc.zone != "" {
		for _, l := range localities {
			if tier(l) == 0 && l.zoneKey == loc.zone {
				zonePreferred = true
			}
		}
	}
	level := func(l *locality) int {
		if !zonePreferred {
			return 2 * tier(l)
		}
		if t := tier(l); t > 0 || l.zoneKey != loc.zone {
			return 2*t + 1
		}
		return 0
	}
	var levels []int
	for _, l := range localities {
		if lv := level(l); !slices.Contains(levels, lv) {
			levels = append(levels, lv)
		}
	}
	slices.Sort(levels)

	cla := &endpointpb.ClusterLoadAssignment{ClusterName: service, Endpoints: make([]*endpointpb.LocalityLbEndpoints, 0, len(localities))}
	for _, l := range localities {
		if l.weight > 1<<32-1 {
			return nil, drops, fmt.Errorf("zone %q: the sum of its weights, %d, exceeds 2^32-1", l.zone, l.weight)
		}
		cla.Endpoints = append(cla.Endpoints, &endpointpb.LocalityLbEndpoints{
			Locality:            &corepb.Locality{Region: l.region, Zone: l.zone},
			LbEndpoints:         l.endpoints,
			LoadBalancingWeight: wrapperspb.UInt32(uint32(l.weight)),
			Priority:            uint32(slices.Index(levels, level(l))),
		})
	}
	return cla, drops, cla.Validate()
}
