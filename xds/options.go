package pushlbxds

import (
	"fmt"
	"slices"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
)

// DefaultMaxClientZones is the default of WithMaxClientZones.
const DefaultMaxClientZones = 64

// Option configures a Server. Each checks its value; NewServer reports
// every problem at once, wrapping ErrInvalidOption.
type Option func(*options) error

type options struct {
	log            zerolog.Logger
	maxZones       int
	regionPriority []string
	http2          bool
	grpcOpts       []grpc.ServerOption
}

func defaultOptions() options {
	return options{log: zerolog.Nop(), maxZones: DefaultMaxClientZones}
}

// WithLogger sets the logger: a line per client zone, per rejected
// (NACKed) response, per dropped instance or ignored weight. Default: no
// logs.
func WithLogger(l zerolog.Logger) Option {
	return func(o *options) error {
		o.log = l
		return nil
	}
}

// WithMaxClientZones bounds the client localities (the region and zone of
// an xDS client's node) that get ClusterLoadAssignments of their own,
// with their zone first (priority 0) and their region next. A client of
// a further locality is served as a client without one: every locality
// at priority 0. Zones are few in a
// deployment; the bound keeps made-up ones from growing the server.
// 0 serves every client as one without a zone. Default
// DefaultMaxClientZones.
func WithMaxClientZones(n int) Option {
	return func(o *options) error {
		if n < 0 {
			return fmt.Errorf("%w: WithMaxClientZones(%d): want 0 or more", ErrInvalidOption, n)
		}
		o.maxZones = n
		return nil
	}
}

// WithRegionPriority sets the order in which clients fail over to other
// regions once their own has no instance they can reach: a client whose
// node names its region (node.locality.region) gets its own region's
// localities first (and those of instances announced without a region),
// then these regions in order, then any other by name, each a priority of
// its own (Envoy's locality failover). A client without a region ignores
// the instances' regions. Default: the client's (pushlb.Config's
// RegionPriority, the gateway's regionPriority).
func WithRegionPriority(regions ...string) Option {
	return func(o *options) error {
		for _, r := range regions {
			if r == "" {
				return fmt.Errorf("%w: WithRegionPriority: an empty region", ErrInvalidOption)
			}
		}
		o.regionPriority = slices.Clone(regions)
		return nil
	}
}

// WithHTTP2Upstreams marks every Cluster as speaking HTTP/2 to its
// instances (Envoy's HttpProtocolOptions with explicit HTTP/2), which
// Envoy needs in front of gRPC servers; grpc-go's xDS client ignores it.
// Default: no protocol options (Envoy speaks HTTP/1.1 upstream).
func WithHTTP2Upstreams() Option {
	return func(o *options) error {
		o.http2 = true
		return nil
	}
}

// WithGRPCServerOptions passes options to the gRPC server that Serve runs
// (credentials, keepalive enforcement, interceptors).
func WithGRPCServerOptions(opts ...grpc.ServerOption) Option {
	return func(o *options) error {
		for i, opt := range opts {
			if opt == nil {
				return fmt.Errorf("%w: WithGRPCServerOptions: option %d is nil", ErrInvalidOption, i)
			}
		}
		o.grpcOpts = append(o.grpcOpts, opts...)
		return nil
	}
}
