package lbconfig

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/base/commalist"
	"github.com/pushlb/pushlb/internal/base/yamlx"
)

// LoadProperties reads the Ribbon client settings of a Java or Spring
// .properties file, so a gateway can take over a Ribbon client's
// configuration as it is.
//
// The file syntax is java.util.Properties': "#" and "!" comments, "key=value",
// "key: value" or "key value", leading whitespace ignored, a trailing
// backslash continuing the line, \uXXXX and \t \n \r \f escapes; a later
// duplicate key replaces an earlier one. The file may be UTF-8 or, like
// Java's, ISO-8859-1 (anything not valid UTF-8 is read as ISO-8859-1).
//
// These keys are read (Ribbon's key names match without regard to case):
//
//   - ribbon.<Key> sets the defaults and <client>.ribbon.<Key> one client;
//     a client's own setting wins over the global one wherever it is in
//     the file.
//   - niws.loadbalancer.<client>.connectionFailureCountThreshold,
//     .circuitTripTimeoutFactorSeconds and .circuitTripMaxTimeoutSeconds
//     set the circuit breaker.
//     niws.loadbalancer.serverStats.activeRequestsCount.effectiveWindowSeconds
//     and niws.loadbalancer.availabilityFilteringRule.activeConnectionsLimit
//     set the defaults.
//   - ZoneAwareNIWSDiscoveryLoadBalancer.enabled,
//     ZoneAwareNIWSDiscoveryLoadBalancer[.<client>].triggeringLoadPerServerThreshold
//     and .avoidZoneWithBlackoutPercetage (Ribbon's spelling; the correct
//     one is accepted too) set zone awareness; they are also accepted as
//     [<client>.]ribbon.ZoneAwareNIWSDiscoveryLoadBalancer.<key>.
//   - In every form above, the client name "default" means the defaults,
//     as in Ribbon's niws.loadbalancer.default.<key>.
//   - The client's zone, for every client: @zone or archaius.deployment.zone
//     (Archaius' deployment context), else eureka.instance.metadata-map.zone
//     (Spring Cloud's fallback), whatever their order.
//
// The Ribbon keys of a client are NFLoadBalancerRuleClassName,
// NIWSServerListFilterClassName, NFLoadBalancerPingClassName,
// NFLoadBalancerPingInterval (seconds), ServerListRefreshInterval (ms),
// listOfServers (comma-separated; a server without a port gets 80, or 443
// for https, as in Ribbon), EnableZoneAffinity, EnableZoneExclusivity,
// zoneAffinity.maxLoadPerServer, zoneAffinity.maxBlackOutServesrPercentage
// (Ribbon's spelling; maxBlackOutServersPercentage is accepted too),
// zoneAffinity.minAvailableServers, ConnectTimeout (ms), ReadTimeout (ms),
// MaxAutoRetries, MaxAutoRetriesNextServer, OkToRetryOnAllOperations and
// ActiveConnectionsLimit (-1, Ribbon's default, means no limit). The ping
// class PingUrl maps to an HTTP ping of "/", what Ribbon's PingUrl does
// when built from configuration; DummyPing, NoOpPing and NIWSDiscoveryPing
// (the registry's status, which pushlb's membership replaces) to no ping.
//
// Keys that belong to Ribbon but that pushlb ignores on purpose
// (NIWSServerListClassName, ServerListUpdaterClassName, connection pool
// sizes, ...) are listed in the result's IgnoredKeys. Keys outside Ribbon's
// namespaces (spring.*, server.port, ...) are skipped. An unknown key
// within a Ribbon namespace, an unknown class name or a malformed value is
// an error naming the line, the key and the value; every resulting Config
// is validated. Errors wrap balancer.ErrInvalidConfig, except errors reading r.
func LoadProperties(r io.Reader) (*balancer.ClientsConfig, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("lbconfig: reading properties: %w", err)
	}
	return loadProperties(data)
}

func loadProperties(data []byte) (*balancer.ClientsConfig, error) {
	props, err := readProperties(data)
	if err != nil {
		return nil, err
	}
	return ribbonConfig(props)
}

// splitNamespaced reads the part of a key after a namespace prefix
// (niws.loadbalancer., ZoneAwareNIWSDiscoveryLoadBalancer.): either a
// global key of globals, or "<client>.<key>" with the key in perClient.
func splitNamespaced(p property, rest, ns string, globals, perClient map[string]ribbonKey) (client, key string, table map[string]ribbonKey, err error) {
	if _, ok := globals[strings.ToLower(rest)]; ok {
		return "", rest, globals, nil
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return "", "", nil, unknownKeyError(p, ns, rest, globals)
	}
	return rest[:i], rest[i+1:], perClient, nil
}

// ribbonKey is a Ribbon key pushlb knows: how it sets a Config, or nil
// when pushlb ignores it on purpose.
type ribbonKey struct {
	name string // as Ribbon spells it
	set  func(c *balancer.Config, v string) error
}

func keyTable(keys ...ribbonKey) map[string]ribbonKey {
	m := make(map[string]ribbonKey, len(keys))
	for _, k := range keys {
		m[strings.ToLower(k.name)] = k
	}
	return m
}

func ignoredKeys(names ...string) []ribbonKey {
	out := make([]ribbonKey, len(names))
	for i, n := range names {
		out[i] = ribbonKey{name: n}
	}
	return out
}

// zoneAwareKeys follow ZoneAwareNIWSDiscoveryLoadBalancer[.<client>].
var zoneAwareKeys = keyTable(
	ribbonKey{"enabled", setZoneAware},
	ribbonKey{"triggeringLoadPerServerThreshold", setTriggeringLoad},
	// Ribbon's spelling, then the correct one.
	ribbonKey{"avoidZoneWithBlackoutPercetage", setBlackoutPercentage},
	ribbonKey{"avoidZoneWithBlackoutPercentage", setBlackoutPercentage},
)

func setZoneAware(c *balancer.Config, v string) error { return setBool(&c.ZoneAware, v) }

func setTriggeringLoad(c *balancer.Config, v string) error {
	return setFloat(&c.ZoneAvoidance.TriggeringLoadPerServer, v)
}

func setBlackoutPercentage(c *balancer.Config, v string) error {
	return setFloat(&c.ZoneAvoidance.BlackoutPercentage, v)
}

// clientKeys follow ribbon. and <client>.ribbon.
var clientKeys = keyTable(append([]ribbonKey{
	{"NFLoadBalancerRuleClassName", setRuleClass},
	{"NIWSServerListFilterClassName", setFilterClass},
	{"NFLoadBalancerPingClassName", setPingClass},
	{"NFLoadBalancerPingInterval", func(c *balancer.Config, v string) error { return setPositive(setSeconds, &c.Ping.Interval, v) }},
	{"ServerListRefreshInterval", func(c *balancer.Config, v string) error {
		return setPositive(setMillis, &c.ServerListRefreshInterval, v)
	}},
	{"listOfServers", setListOfServers},
	{"EnableZoneAffinity", func(c *balancer.Config, v string) error { return setBool(&c.ZoneAffinity.Enabled, v) }},
	{"EnableZoneExclusivity", func(c *balancer.Config, v string) error { return setBool(&c.ZoneAffinity.Exclusive, v) }},
	{"zoneAffinity.maxLoadPerServer", func(c *balancer.Config, v string) error { return setFloat(&c.ZoneAffinity.MaxLoadPerServer, v) }},
	// Ribbon reads maxBlackOutServesrPercentage; the misspelling
	// maxBlackOutServesrsPercentage circulates too; then the correct one.
	{"zoneAffinity.maxBlackOutServesrPercentage", setMaxBlackout},
	{"zoneAffinity.maxBlackOutServesrsPercentage", setMaxBlackout},
	{"zoneAffinity.maxBlackOutServersPercentage", setMaxBlackout},
	{"zoneAffinity.minAvailableServers", func(c *balancer.Config, v string) error {
		return setCount(&c.ZoneAffinity.MinAvailableServers, v)
	}},
	{"ConnectTimeout", func(c *balancer.Config, v string) error { return setPositive(setMillis, &c.ConnectTimeout, v) }},
	{"ReadTimeout", func(c *balancer.Config, v string) error { return setPositive(setMillis, &c.ReadTimeout, v) }},
	{"MaxAutoRetries", func(c *balancer.Config, v string) error { return setCount(&c.MaxAutoRetries, v) }},
	{"MaxAutoRetriesNextServer", func(c *balancer.Config, v string) error { return setCount(&c.MaxAutoRetriesNextServer, v) }},
	{"OkToRetryOnAllOperations", func(c *balancer.Config, v string) error { return setBool(&c.RetryAllOperations, v) }},
	{"ActiveConnectionsLimit", setActiveConnectionsLimit},
	{"ZoneAwareNIWSDiscoveryLoadBalancer.enabled", setZoneAware},
	{"ZoneAwareNIWSDiscoveryLoadBalancer.triggeringLoadPerServerThreshold", setTriggeringLoad},
	{"ZoneAwareNIWSDiscoveryLoadBalancer.avoidZoneWithBlackoutPercetage", setBlackoutPercentage},
	{"ZoneAwareNIWSDiscoveryLoadBalancer.avoidZoneWithBlackoutPercentage", setBlackoutPercentage},
},
	// Ribbon's CommonClientConfigKey keys that pushlb does not use: the
	// membership replaces server lists and updaters, the HTTP layer has
	// its own transport settings.
	ignoredKeys(
		"AppName", "Version", "Port", "SecurePort", "VipAddress", "ForceClientPortConfiguration",
		"DeploymentContextBasedVipAddresses", "RequestSpecificRetryOn", "ReceiveBufferSize",
		"EnablePrimeConnections", "PrimeConnectionsClassName", "MaxRetriesPerServerPrimeConnection",
		"MaxTotalTimeToPrimeConnections", "MinPrimeConnectionsRatio", "PrimeConnectionsURI",
		"PoolMaxThreads", "PoolMinThreads", "PoolKeepAliveTime", "PoolKeepAliveTimeUnits",
		"PoolMaxThreadsPerRoute", "EnableConnectionPool", "MaxHttpConnectionsPerHost",
		"MaxTotalHttpConnections", "MaxConnectionsPerHost", "MaxTotalConnections", "IsSecure",
		"GZipPayload", "BackoffTimeout", "SendBufferSize", "StaleCheckingEnabled", "Linger",
		"ConnectionManagerTimeout", "FollowRedirects", "ConnectionPoolCleanerTaskEnabled",
		"ConnIdleEvictTimeMilliSeconds", "ConnectionCleanerRepeatInterval",
		"EnableGZIPContentEncodingFilter", "ProxyHost", "ProxyPort", "KeyStore", "KeyStorePassword",
		"TrustStore", "TrustStorePassword", "IsClientAuthRequired", "CustomSSLSocketFactoryClassName",
		"IsHostnameValidationRequired", "IgnoreUserTokenInConnectionPoolForSecureClient",
		"ClientClassName", "InitializeNFLoadBalancer", "NFLoadBalancerClassName",
		"NFLoadBalancerMaxTotalPingTime", "NFLoadBalancerStatsClassName", "NIWSServerListClassName",
		"ServerListUpdaterClassName", "EnableMarkingServerDownOnReachingFailureLimit",
		"ServerDownFailureLimit", "ServerDownStatWindowInMillis", "PrioritizeVipAddressBasedServers",
		"VipAddressResolverClassName", "TargetRegion", "RulePredicateClasses", "RequestIdHeaderName",
		"UseIPAddrForServer",
		// Spring Cloud Netflix's keys in the ribbon namespace.
		"retryableStatusCodes", "eager-load.enabled", "eager-load.clients", "eureka.enabled",
		"http.client.enabled", "okhttp.enabled", "restclient.enabled", "secure-ports",
	)...)...)

func setMaxBlackout(c *balancer.Config, v string) error {
	return setFloat(&c.ZoneAffinity.MaxBlackoutPercentage, v)
}

// breakerKeys follow niws.loadbalancer.<client>.
var breakerKeys = keyTable(
	ribbonKey{"connectionFailureCountThreshold", func(c *balancer.Config, v string) error {
		if err := setCount(&c.Breaker.Threshold, v); err != nil {
			return err
		}
		if c.Breaker.Threshold < 1 {
			return errors.New("must be at least 1")
		}
		return nil
	}},
	ribbonKey{"circuitTripTimeoutFactorSeconds", func(c *balancer.Config, v string) error { return setSeconds(&c.Breaker.Factor, v) }},
	ribbonKey{"circuitTripMaxTimeoutSeconds", func(c *balancer.Config, v string) error { return setSeconds(&c.Breaker.Max, v) }},
)

// niwsGlobalKeys follow niws.loadbalancer. and set the defaults.
var niwsGlobalKeys = keyTable(
	ribbonKey{"serverStats.activeRequestsCount.effectiveWindowSeconds", func(c *balancer.Config, v string) error {
		return setPositive(setSeconds, &c.ActiveRequestsTimeout, v)
	}},
	ribbonKey{"availabilityFilteringRule.activeConnectionsLimit", setActiveConnectionsLimit},
	// pushlb's availability predicate always skips tripped servers, and
	// ZoneAvoidance always considers zones.
	ribbonKey{name: "availabilityFilteringRule.filterCircuitTripped"},
	ribbonKey{name: "zoneAvoidanceRule.enabled"},
)

// zoneProperties set the client zone of the defaults; deployment-context
// keys win over Eureka's metadata, as in Spring Cloud Netflix.
var zoneProperties = map[string]int{
	"@zone":                             2,
	"archaius.deployment.zone":          2,
	"eureka.instance.metadata-map.zone": 1,
	"eureka.instance.metadatamap.zone":  1,
}

const (
	zoneAwarePrefix = "zoneawareniwsdiscoveryloadbalancer."
	niwsPrefix      = "niws.loadbalancer."
	ribbonNS        = "ribbon."
)

// propertyError reports a bad value of key.
func propertyError(p property, why error) error {
	return fmt.Errorf("%w: line %d: %s = %q: %w", balancer.ErrInvalidConfig, p.line, p.key, p.value, why)
}

func unknownKeyError(p property, ns, key string, table map[string]ribbonKey) error {
	names := make([]string, 0, len(table))
	for _, k := range table {
		names = append(names, k.name)
	}
	sort.Strings(names)
	hint := ""
	if s := yamlx.Suggest(key, names); s != "" {
		hint = fmt.Sprintf("; did you mean %q?", s)
	}
	if hint == "" && ns == "Ribbon" {
		if k, ok := breakerKeys[strings.ToLower(key)]; ok {
			hint = fmt.Sprintf("; Ribbon reads %s as niws.loadbalancer.<client>.%s", k.name, k.name)
		}
	}
	return fmt.Errorf("%w: line %d: %s: unknown %s key %q%s", balancer.ErrInvalidConfig, p.line, p.key, ns, key, hint)
}

// lineError is an error about the property at line.
type lineError struct {
	line int
	err  error
}

// assignment is a property that sets a known key of one scope.
type assignment struct {
	p   property
	set func(c *balancer.Config, v string) error
}

// ribbonConfig maps properties onto a balancer.ClientsConfig.
func ribbonConfig(props []property) (*balancer.ClientsConfig, error) {
	out := balancer.DefaultClientsConfig()
	var (
		global    []assignment
		perClient = make(map[string][]assignment)
		clients   []string // in order of first appearance
		zone      string
		zoneRank  int
		errs      []lineError
	)
	addClient := func(name string, a *assignment) {
		if name == "default" || name == "" {
			if a != nil {
				global = append(global, *a)
			}
			return
		}
		list, known := perClient[name]
		if !known {
			clients = append(clients, name)
		}
		if a != nil {
			list = append(list, *a)
		}
		perClient[name] = list
	}
	for _, p := range props {
		lk := strings.ToLower(p.key)
		if rank, ok := zoneProperties[lk]; ok {
			if z := strings.TrimSpace(p.value); z != "" && rank >= zoneRank {
				zone, zoneRank = z, rank
			}
			continue
		}
		var (
			client string
			key    string
			table  map[string]ribbonKey
			ns     string
		)
		switch {
		case strings.HasPrefix(lk, "spring."):
			continue // e.g. spring.cloud.loadbalancer.ribbon.enabled
		case strings.HasPrefix(lk, ribbonNS):
			key, table, ns = p.key[len(ribbonNS):], clientKeys, "Ribbon"
		case strings.HasPrefix(lk, niwsPrefix):
			var err error
			client, key, table, err = splitNamespaced(p, p.key[len(niwsPrefix):], "niws.loadbalancer", niwsGlobalKeys, breakerKeys)
			if err != nil {
				errs = append(errs, lineError{p.line, err})
				continue
			}
			ns = "niws.loadbalancer"
		case strings.HasPrefix(lk, zoneAwarePrefix):
			var err error
			client, key, table, err = splitNamespaced(p, p.key[len(zoneAwarePrefix):], "ZoneAwareNIWSDiscoveryLoadBalancer", zoneAwareKeys, zoneAwareKeys)
			if err != nil {
				errs = append(errs, lineError{p.line, err})
				continue
			}
			ns = "ZoneAwareNIWSDiscoveryLoadBalancer"
		default:
			i := strings.Index(lk, "."+ribbonNS)
			if i <= 0 {
				continue // not Ribbon's: server.port, eureka.client.*, ...
			}
			client, key, table, ns = p.key[:i], p.key[i+1+len(ribbonNS):], clientKeys, "Ribbon"
		}
		k, ok := table[strings.ToLower(key)]
		if !ok {
			errs = append(errs, lineError{p.line, unknownKeyError(p, ns, key, table)})
			continue
		}
		if k.set == nil {
			out.IgnoredKeys = append(out.IgnoredKeys, p.key)
			addClient(client, nil)
			continue
		}
		addClient(client, &assignment{p: p, set: k.set})
	}
	apply := func(cfg *balancer.Config, list []assignment) {
		for _, a := range list {
			if err := a.set(cfg, a.p.value); err != nil {
				errs = append(errs, lineError{a.p.line, propertyError(a.p, err)})
			}
		}
	}
	apply(&out.Defaults, global)
	if zoneRank > 0 {
		out.Defaults.Zone = zone
	}
	for _, name := range clients {
		cfg := out.Defaults
		cfg.ListOfServers, cfg.RegionPriority = slices.Clone(cfg.ListOfServers), slices.Clone(cfg.RegionPriority)
		apply(&cfg, perClient[name])
		out.Clients[name] = cfg
	}
	if len(errs) > 0 {
		// In file order, whichever pass found them.
		slices.SortStableFunc(errs, func(a, b lineError) int { return a.line - b.line })
		list := make([]error, len(errs))
		for i, e := range errs {
			list[i] = e.err
		}
		return nil, errors.Join(list...)
	}
	if err := out.Validate(); err != nil {
		return nil, err
	}
	return out, nil
}

func setRuleClass(c *balancer.Config, v string) error {
	r, err := balancer.CanonicalRule(v)
	if err != nil {
		return fmt.Errorf("unknown rule (want a com.netflix.loadbalancer rule class or one of %s)",
			strings.Join(balancer.RuleNames(), ", "))
	}
	c.Rule = r
	return nil
}

func setFilterClass(c *balancer.Config, v string) error {
	f, err := balancer.CanonicalFilter(v)
	if err != nil {
		return fmt.Errorf("unknown server list filter (want ZoneAffinityServerListFilter, "+
			"ZonePreferenceServerListFilter, DefaultNIWSServerListFilter or one of %s)", strings.Join(balancer.FilterNames(), ", "))
	}
	c.Filter = f
	return nil
}

// ribbonPings maps Ribbon's ping classes, full or simple names, lower case.
var ribbonPings = map[string]string{
	"com.netflix.loadbalancer.dummyping":              balancer.PingNone,
	"com.netflix.loadbalancer.noopping":               balancer.PingNone,
	"com.netflix.niws.loadbalancer.niwsdiscoveryping": balancer.PingNone, // the registry's status: pushlb's membership
	"com.netflix.loadbalancer.pingurl":                balancer.PingHTTP,
	"dummyping":                                       balancer.PingNone,
	"noopping":                                        balancer.PingNone,
	"niwsdiscoveryping":                               balancer.PingNone,
	"pingurl":                                         balancer.PingHTTP,
	balancer.PingNone:                                 balancer.PingNone,
	balancer.PingHTTP:                                 balancer.PingHTTP,
}

func setPingClass(c *balancer.Config, v string) error {
	kind, ok := ribbonPings[strings.ToLower(strings.TrimSpace(v))]
	if !ok {
		return errors.New("unknown ping (want com.netflix.loadbalancer.DummyPing, NoOpPing, PingUrl " +
			"or com.netflix.niws.loadbalancer.NIWSDiscoveryPing)")
	}
	c.Ping.Kind = kind
	if kind == balancer.PingHTTP {
		// PingUrl built from configuration pings the server's root.
		c.Ping.Path = "/"
	}
	return nil
}

func setListOfServers(c *balancer.Config, v string) error {
	list := commalist.Split(v)
	for i, s := range list {
		list[i] = withDefaultPort(s)
		if _, err := balancer.ParseServer(list[i]); err != nil {
			return err
		}
	}
	c.ListOfServers = list
	return nil
}

// withDefaultPort adds Ribbon's default port to a server written without
// one: 443 for https, else 80.
func withDefaultPort(s string) string {
	scheme, hostPart := "", s
	if i := strings.Index(s, "://"); i >= 0 {
		scheme, hostPart = strings.ToLower(s[:i]), s[i+3:]
	}
	hostPart = strings.TrimSuffix(hostPart, "/")
	if _, _, err := net.SplitHostPort(hostPart); err == nil {
		return s
	}
	if hostPart == "" || (strings.Contains(hostPart, ":") && !strings.HasSuffix(hostPart, "]")) {
		return s // not a bare host: let balancer.ParseServer report it
	}
	port := "80"
	if scheme == "https" {
		port = "443"
	}
	return strings.TrimSuffix(s, "/") + ":" + port
}

func setActiveConnectionsLimit(c *balancer.Config, v string) error {
	n, err := parseWhole(v)
	if err != nil {
		return err
	}
	switch {
	case n == -1:
		n = 0 // Ribbon's "no limit"
	case n < 0:
		return errors.New("must not be negative (-1 means no limit)")
	}
	c.ActiveConnectionsLimit = n
	return nil
}

func parseWhole(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, errors.New("not a whole number")
	}
	return n, nil
}

// setCount sets a count that must not be negative.
func setCount(dst *int, v string) error {
	n, err := parseWhole(v)
	if err != nil {
		return err
	}
	if n < 0 {
		return errors.New("must not be negative")
	}
	*dst = n
	return nil
}

func setDuration(dst *time.Duration, v string, unit time.Duration, unitName string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return fmt.Errorf("not a whole number of %s", unitName)
	}
	if n < 0 {
		return errors.New("must not be negative")
	}
	if n > int64(math.MaxInt64/unit) {
		return errors.New("out of range")
	}
	*dst = time.Duration(n) * unit
	return nil
}

// setPositive sets a duration with set and rejects 0.
func setPositive(set func(*time.Duration, string) error, dst *time.Duration, v string) error {
	var d time.Duration
	if err := set(&d, v); err != nil {
		return err
	}
	if d == 0 {
		return errors.New("must be positive")
	}
	*dst = d
	return nil
}

func setMillis(dst *time.Duration, v string) error {
	return setDuration(dst, v, time.Millisecond, "milliseconds")
}

func setSeconds(dst *time.Duration, v string) error {
	return setDuration(dst, v, time.Second, "seconds")
}

func setFloat(dst *float64, v string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return errors.New("not a number")
	}
	*dst = f
	return nil
}

// setBool accepts what Archaius (Apache Commons Configuration) accepts:
// true/false, yes/no, on/off, in any case.
func setBool(dst *bool, v string) error {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true", "yes", "on":
		*dst = true
	case "false", "no", "off":
		*dst = false
	default:
		return errors.New("not a boolean (want true or false)")
	}
	return nil
}
