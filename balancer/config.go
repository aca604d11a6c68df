package balancer

import (
	"fmt"
	"slices"
	"time"
)

// Config is the configuration of one client's balancer. Zero values are not
// meaningful: start from [DefaultConfig] and change what you need; the YAML
// and Ribbon-properties loaders (package lbconfig) do the same.
type Config struct {
	// Rule names the rule: RoundRobin, Random, WeightedResponseTime,
	// BestAvailable, AvailabilityFiltering, ZoneAvoidance (default), Retry,
	// Rendezvous (keyed: builds Maglev), LeastRequest, Maglev (keyed).
	// Ribbon's class names are accepted too.
	Rule string `yaml:"rule"`
	// Filter names the zone filter: ZonePreference (default, as in Spring
	// Cloud), ZoneAffinity, or None.
	Filter string `yaml:"filter"`
	// Zone is the client's own zone, used by the zone filters. Empty turns
	// them off.
	Zone string `yaml:"zone"`
	// Region is the client's own region. With it, picks go to the nearest
	// region with a reachable server: this one (servers whose Region is
	// empty or this one), then RegionPriority's in order, then any other
	// (the package doc, "Regions"). Empty ignores the servers' regions.
	Region string `yaml:"region"`
	// RegionPriority lists other regions in the order picks fail over to
	// them; regions not listed come after, in name order.
	RegionPriority []string `yaml:"regionPriority"`
	// LocalRegionOnly keeps the service in Region: servers of other
	// regions are left out of its list, even when Region has none left.
	// RegionPriority and LocalRegionOnly need a Region (RegionsUnset).
	LocalRegionOnly bool `yaml:"localRegionOnly"`
	// ZoneAware enables the zone-aware choice of ZoneAwareLoadBalancer:
	// avoid blacked-out or overloaded zones, then pick a zone weighted by its
	// instance count. Default true.
	ZoneAware bool `yaml:"zoneAware"`
	// ZoneAffinity holds the settings of the ZoneAffinity filter.
	ZoneAffinity ZoneAffinityConfig `yaml:"zoneAffinity"`
	// ZoneAvoidance holds the thresholds of the zone-avoidance logic.
	ZoneAvoidance ZoneAvoidanceConfig `yaml:"zoneAvoidance"`
	// ZoneStatsInterval bounds how stale the per-zone statistics behind the
	// zone choice (zone avoidance, the ZoneAffinity filter) may be: the
	// choice is made again from fresh statistics when a request starts or
	// ends, or a pick is made, this long after it was last made. A list
	// change, and a breaker that trips or resets, remake it at once; a
	// blackout's end is seen by the first pick after it. 0 remakes it for
	// every pick and every request's start and end, O(servers) each.
	// Default 100ms.
	ZoneStatsInterval time.Duration `yaml:"zoneStatsInterval"`

	// Breaker is the circuit breaker of every server's stats.
	Breaker BreakerConfig `yaml:"breaker"`
	// ActiveRequestsTimeout is how long an untouched active-request count
	// stays valid before it reads as 0 (Ribbon's 600 s window).
	ActiveRequestsTimeout time.Duration `yaml:"activeRequestsTimeout"`
	// ActiveConnectionsLimit makes the availability predicate skip servers
	// with this many active requests or more. 0 means no limit.
	ActiveConnectionsLimit int `yaml:"activeConnectionsLimit"`
	// WeightsInterval is how often WeightedResponseTime rebuilds its
	// weights. Default 30s.
	WeightsInterval time.Duration `yaml:"weightsInterval"`
	// RetryTimeout is how long the Retry rule keeps re-choosing. Default 500ms.
	RetryTimeout time.Duration `yaml:"retryTimeout"`
	// RetrySubRule names the rule Retry wraps. Default RoundRobin.
	RetrySubRule string `yaml:"retrySubRule"`
	// SlowStart ramps a new server's traffic up over a window (Envoy's
	// slow_start_config, Dubbo's warm-up); off by default (see
	// SlowStartConfig and the package doc, "Slow start").
	SlowStart SlowStartConfig `yaml:"slowStart"`

	// Ping configures liveness checks; the default pings nothing and treats
	// every listed server as alive.
	Ping PingConfig `yaml:"ping"`
	// ServerListRefreshInterval is the polling updater's interval
	// (Ribbon's ServerListRefreshInterval). Default 30s.
	ServerListRefreshInterval time.Duration `yaml:"serverListRefreshInterval"`
	// ListOfServers is a static list ("host:port" or "scheme://host:port").
	ListOfServers []string `yaml:"listOfServers"`

	// ConnectTimeout and ReadTimeout bound each HTTP attempt. Default 1s each.
	ConnectTimeout time.Duration `yaml:"connectTimeout"`
	ReadTimeout    time.Duration `yaml:"readTimeout"`
	// MaxAutoRetries is the number of retries on the same server. Default 0.
	MaxAutoRetries int `yaml:"maxAutoRetries"`
	// MaxAutoRetriesNextServer is the number of other servers tried after
	// the first. Default 1.
	MaxAutoRetriesNextServer int `yaml:"maxAutoRetriesNextServer"`
	// RetryAllOperations retries non-idempotent requests after failures
	// where the request may have been sent (Ribbon's OkToRetryOnAllOperations).
	// Default false: they are retried only when nothing was sent.
	RetryAllOperations bool `yaml:"retryAllOperations"`

	// OutlierDetection ejects servers that answer with server errors
	// (outlier.go). Off by default.
	OutlierDetection OutlierConfig `yaml:"outlierDetection"`
	// PanicThreshold is Envoy's healthy panic threshold, in percent: when
	// fewer than this share of a service's alive servers are healthy (not
	// tripped, not ejected), picks balance over all of them, as if none
	// were, rather than pile onto the few left. 0 turns it off, the
	// default: Ribbon's rules skip tripped servers however many are
	// tripped, and pushlb keeps Ribbon's behaviour unless asked; Envoy's
	// default is 50 (see docs/balancer.md, "Panic threshold").
	PanicThreshold float64 `yaml:"panicThreshold"`
}

// OutlierConfig is passive outlier detection on answers, as Envoy's
// outlier_detection with consecutive_5xx: a server whose answers are
// Consecutive5xx server errors in a row (HTTP 5xx, a gRPC server failure;
// DoneInfo.ServerError) is ejected, left out of every pick, for
// BaseEjectionTime times the number of times it was ejected in a row,
// at most MaxEjectionTime; never more than MaxEjectionPercent of a
// service's servers at once, but always one. It is distinct from the
// circuit breaker, which counts connection failures: a server that
// answers is reachable, an outlier answers badly.
type OutlierConfig struct {
	// Consecutive5xx is the number of server errors in a row that ejects
	// a server. 0 turns outlier detection off (the default); Envoy uses 5.
	Consecutive5xx int `yaml:"consecutive5xx"`
	// BaseEjectionTime is the first ejection's length. Default 30s.
	BaseEjectionTime time.Duration `yaml:"baseEjectionTime"`
	// MaxEjectionTime caps an ejection's length; a server not ejected for
	// this long starts again from BaseEjectionTime. Default 300s.
	MaxEjectionTime time.Duration `yaml:"maxEjectionTime"`
	// MaxEjectionPercent is the largest share of a service's servers
	// ejected at once, in percent (one server may always be). Default 10.
	MaxEjectionPercent float64 `yaml:"maxEjectionPercent"`
}

// ZoneAffinityConfig configures the ZoneAffinity filter (Ribbon's
// ZoneAffinityServerListFilter).
type ZoneAffinityConfig struct {
	// Enabled keeps same-zone servers unless the zone is in trouble
	// (EnableZoneAffinity).
	Enabled bool `yaml:"enabled"`
	// Exclusive keeps same-zone servers whatever their state
	// (EnableZoneExclusivity). When the zone has no server at all, pushlb
	// uses all servers rather than failing every request.
	Exclusive bool `yaml:"exclusive"`
	// MaxLoadPerServer: at or above this load per same-zone server, affinity
	// is dropped. Default 0.6.
	MaxLoadPerServer float64 `yaml:"maxLoadPerServer"`
	// MaxBlackoutPercentage: at or above this share of tripped same-zone
	// servers, affinity is dropped. Default 0.8.
	MaxBlackoutPercentage float64 `yaml:"maxBlackoutPercentage"`
	// MinAvailableServers: with fewer non-tripped same-zone servers, affinity
	// is dropped. Default 2.
	MinAvailableServers int `yaml:"minAvailableServers"`
}

// ZoneAvoidanceConfig holds the thresholds of Ribbon's available-zone logic.
type ZoneAvoidanceConfig struct {
	// TriggeringLoadPerServer: when the worst zone's load per server reaches
	// this, that zone is avoided. Default 0.2.
	TriggeringLoadPerServer float64 `yaml:"triggeringLoadPerServer"`
	// BlackoutPercentage: a zone with this share of tripped servers is
	// avoided. Default 0.99999.
	BlackoutPercentage float64 `yaml:"blackoutPercentage"`
}

// PingConfig configures liveness checks.
type PingConfig struct {
	// Kind is "none" (default: every listed server is alive, no ping loop)
	// or "http" (GET Path, 2xx means alive).
	Kind string `yaml:"kind"`
	// Path is the HTTP ping path. Default "/health".
	Path string `yaml:"path"`
	// Interval between ping rounds. Default 30s.
	Interval time.Duration `yaml:"interval"`
	// Timeout of one ping. Default 2s.
	Timeout time.Duration `yaml:"timeout"`
}

// Rule and filter names.
const (
	RuleRoundRobin            = "RoundRobin"
	RuleRandom                = "Random"
	RuleWeightedResponseTime  = "WeightedResponseTime"
	RuleBestAvailable         = "BestAvailable"
	RuleAvailabilityFiltering = "AvailabilityFiltering"
	RuleZoneAvoidance         = "ZoneAvoidance"
	RuleRetry                 = "Retry"
	RuleRendezvous            = "Rendezvous" // builds Maglev (an alias since issue 11)
	RuleLeastRequest          = "LeastRequest"
	RuleMaglev                = "Maglev"

	FilterNone           = "None"
	FilterZoneAffinity   = "ZoneAffinity"
	FilterZonePreference = "ZonePreference"

	PingNone = "none"
	PingHTTP = "http"
)

// DefaultConfig returns Ribbon's and Spring Cloud's defaults.
func DefaultConfig() Config {
	return Config{
		Rule:      RuleZoneAvoidance,
		Filter:    FilterZonePreference,
		ZoneAware: true,
		ZoneAffinity: ZoneAffinityConfig{
			MaxLoadPerServer:      0.6,
			MaxBlackoutPercentage: 0.8,
			MinAvailableServers:   2,
		},
		ZoneAvoidance: ZoneAvoidanceConfig{
			TriggeringLoadPerServer: 0.2,
			BlackoutPercentage:      0.99999,
		},
		ZoneStatsInterval:         100 * time.Millisecond,
		Breaker:                   BreakerConfig{Threshold: 3, Factor: 10 * time.Second, Max: 30 * time.Second},
		ActiveRequestsTimeout:     600 * time.Second,
		WeightsInterval:           30 * time.Second,
		RetryTimeout:              500 * time.Millisecond,
		RetrySubRule:              RuleRoundRobin,
		SlowStart:                 SlowStartConfig{MinWeightPercent: DefaultSlowStartMinWeightPercent, Aggression: DefaultSlowStartAggression},
		Ping:                      PingConfig{Kind: PingNone, Path: "/health", Interval: 30 * time.Second, Timeout: 2 * time.Second},
		ServerListRefreshInterval: 30 * time.Second,
		ConnectTimeout:            time.Second,
		ReadTimeout:               time.Second,
		MaxAutoRetriesNextServer:  1,
		OutlierDetection:          OutlierConfig{BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second, MaxEjectionPercent: 10},
	}
}

// Validate reports the first invalid setting, wrapping ErrInvalidConfig.
func (c *Config) Validate() error {
	bad := func(field string, v any, why string) error {
		return &FieldError{Field: field, Err: fmt.Errorf("%w: %s = %v: %s", ErrInvalidConfig, field, v, why)}
	}
	if _, err := canonicalRule(c.Rule); err != nil {
		return &FieldError{Field: "rule", Err: err}
	}
	if c.Rule == RuleRetry || c.Rule == "" {
		if _, err := canonicalRule(c.RetrySubRule); err != nil {
			return &FieldError{Field: "retrySubRule", Err: err}
		}
	}
	if _, err := canonicalFilter(c.Filter); err != nil {
		return &FieldError{Field: "filter", Err: err}
	}
	switch {
	case c.ZoneAffinity.MaxLoadPerServer < 0:
		return bad("zoneAffinity.maxLoadPerServer", c.ZoneAffinity.MaxLoadPerServer, "must not be negative")
	case c.ZoneAffinity.MaxBlackoutPercentage < 0 || c.ZoneAffinity.MaxBlackoutPercentage > 1:
		return bad("zoneAffinity.maxBlackoutPercentage", c.ZoneAffinity.MaxBlackoutPercentage, "must be within 0 and 1")
	case c.ZoneAffinity.MinAvailableServers < 0:
		return bad("zoneAffinity.minAvailableServers", c.ZoneAffinity.MinAvailableServers, "must not be negative")
	case c.ZoneAvoidance.TriggeringLoadPerServer < 0:
		return bad("zoneAvoidance.triggeringLoadPerServer", c.ZoneAvoidance.TriggeringLoadPerServer, "must not be negative")
	case c.ZoneAvoidance.BlackoutPercentage <= 0 || c.ZoneAvoidance.BlackoutPercentage > 1:
		return bad("zoneAvoidance.blackoutPercentage", c.ZoneAvoidance.BlackoutPercentage, "must be within 0 (excluded) and 1")
	case c.ZoneStatsInterval < 0:
		return bad("zoneStatsInterval", c.ZoneStatsInterval, "must not be negative")
	case c.Breaker.Threshold < 1:
		return bad("breaker.threshold", c.Breaker.Threshold, "must be at least 1")
	case c.Breaker.Factor < 0:
		return bad("breaker.factor", c.Breaker.Factor, "must not be negative")
	case c.Breaker.Max < 0:
		return bad("breaker.max", c.Breaker.Max, "must not be negative")
	case c.ActiveRequestsTimeout <= 0:
		return bad("activeRequestsTimeout", c.ActiveRequestsTimeout, "must be positive")
	case c.ActiveConnectionsLimit < 0:
		return bad("activeConnectionsLimit", c.ActiveConnectionsLimit, "must not be negative")
	case c.WeightsInterval <= 0:
		return bad("weightsInterval", c.WeightsInterval, "must be positive")
	case c.RetryTimeout <= 0:
		return bad("retryTimeout", c.RetryTimeout, "must be positive")
	case c.Ping.Kind != PingNone && c.Ping.Kind != PingHTTP && c.Ping.Kind != "":
		return bad("ping.kind", c.Ping.Kind, `must be "none" or "http"`)
	case c.Ping.Kind == PingHTTP && c.Ping.Interval <= 0:
		return bad("ping.interval", c.Ping.Interval, "must be positive")
	case c.Ping.Kind == PingHTTP && c.Ping.Timeout <= 0:
		return bad("ping.timeout", c.Ping.Timeout, "must be positive")
	case c.ServerListRefreshInterval <= 0:
		return bad("serverListRefreshInterval", c.ServerListRefreshInterval, "must be positive")
	case c.ConnectTimeout <= 0:
		return bad("connectTimeout", c.ConnectTimeout, "must be positive")
	case c.ReadTimeout <= 0:
		return bad("readTimeout", c.ReadTimeout, "must be positive")
	case c.MaxAutoRetries < 0:
		return bad("maxAutoRetries", c.MaxAutoRetries, "must not be negative")
	case c.MaxAutoRetriesNextServer < 0:
		return bad("maxAutoRetriesNextServer", c.MaxAutoRetriesNextServer, "must not be negative")
	case c.OutlierDetection.Consecutive5xx < 0:
		return bad("outlierDetection.consecutive5xx", c.OutlierDetection.Consecutive5xx, "must not be negative (0: off)")
	case c.OutlierDetection.Consecutive5xx > 0 && c.OutlierDetection.BaseEjectionTime <= 0:
		return bad("outlierDetection.baseEjectionTime", c.OutlierDetection.BaseEjectionTime, "must be positive")
	case c.OutlierDetection.Consecutive5xx > 0 && c.OutlierDetection.MaxEjectionTime < c.OutlierDetection.BaseEjectionTime:
		return bad("outlierDetection.maxEjectionTime", c.OutlierDetection.MaxEjectionTime, "must be at least baseEjectionTime")
	case c.OutlierDetection.MaxEjectionPercent < 0 || c.OutlierDetection.MaxEjectionPercent > 100:
		return bad("outlierDetection.maxEjectionPercent", c.OutlierDetection.MaxEjectionPercent, "must be within 0 and 100")
	case c.PanicThreshold < 0 || c.PanicThreshold > 100:
		return bad("panicThreshold", c.PanicThreshold, "must be within 0 and 100 (0: off)")
	}
	if err := c.SlowStart.validate(bad); err != nil {
		return err
	}
	if err := c.validateRegions(bad); err != nil {
		return err
	}
	for i, s := range c.ListOfServers {
		if _, err := ParseServer(s); err != nil {
			field := fmt.Sprintf("listOfServers[%d]", i)
			return &FieldError{Field: field, Err: fmt.Errorf("%w: %s: %w", ErrInvalidConfig, field, err)}
		}
	}
	return nil
}

// CanonicalRule returns pushlb's name of a rule written another way
// ("roundrobin", "RoundRobinRule", a Ribbon class name), or an error
// wrapping ErrInvalidConfig for an unknown rule.
func CanonicalRule(name string) (string, error) { return canonicalRule(name) }

// CanonicalFilter is CanonicalRule for zone filters.
func CanonicalFilter(name string) (string, error) { return canonicalFilter(name) }

// RuleNames returns the rule names, in the order the docs list them.
func RuleNames() []string { return slices.Clone(ruleNames) }

// FilterNames returns the zone filter names.
func FilterNames() []string { return slices.Clone(filterNames) }

// StaticServers parses ListOfServers.
func (c *Config) StaticServers() ([]Server, error) {
	out := make([]Server, 0, len(c.ListOfServers))
	for i, s := range c.ListOfServers {
		srv, err := ParseServer(s)
		if err != nil {
			return nil, fmt.Errorf("%w: listOfServers[%d]: %w", ErrInvalidConfig, i, err)
		}
		out = append(out, srv)
	}
	return out, nil
}

// validateRegions checks RegionPriority against Region. Without a Region
// (which pushlb.Config.Region may fill in later), RegionPriority and
// LocalRegionOnly do nothing: RegionsUnset tells.
func (c *Config) validateRegions(bad func(field string, v any, why string) error) error {
	seen := map[string]bool{lowerASCII(c.Region): true}
	for i, r := range c.RegionPriority {
		field := fmt.Sprintf("regionPriority[%d]", i)
		switch k := lowerASCII(r); {
		case r == "":
			return bad(field, `""`, "must not be empty")
		case k == lowerASCII(c.Region):
			return bad(field, r, "is the own region, which always comes first")
		case seen[k]:
			return bad(field, r, "is listed twice")
		default:
			seen[k] = true
		}
	}
	return nil
}

// RegionsUnset reports whether c sets RegionPriority or LocalRegionOnly
// without a Region, where they would do nothing.
func (c *Config) RegionsUnset() bool {
	return c.Region == "" && (len(c.RegionPriority) > 0 || c.LocalRegionOnly)
}
