package gossip

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func TestInvalidConfig(t *testing.T) {
	good := func() Config { return fastConfig(instanceMeta("orders", "i-1", 1)) }
	tests := []struct {
		name string
		edit func(*Config)
		also error // a second sentinel the error must wrap
	}{
		{name: "key of 10 bytes", edit: func(c *Config) { c.SecretKey = make([]byte, 10) }},
		{name: "key of 33 bytes", edit: func(c *Config) { c.SecretKey = make([]byte, 33) }},
		{name: "oversized meta", also: ErrMetaTooLarge,
			edit: func(c *Config) { c.Meta.InstanceID = strings.Repeat("x", 480) }},
		{name: "meta without role", also: ErrInvalidMeta, edit: func(c *Config) { c.Meta = Meta{} }},
		{name: "unknown role", also: ErrInvalidMeta, edit: func(c *Config) { c.Meta.Role = "db" }},
		{name: "instance without service", also: ErrInvalidMeta, edit: func(c *Config) { c.Meta.Service = "" }},
		{name: "instance without id", also: ErrInvalidMeta, edit: func(c *Config) { c.Meta.InstanceID = "" }},
		{name: "instance without incarnation", also: ErrInvalidMeta, edit: func(c *Config) { c.Meta.Incarnation = 0 }},
		{name: "id not UTF-8", also: ErrInvalidMeta, edit: func(c *Config) { c.Meta.InstanceID = "a\xffb" }},
		{name: "bind without port", edit: func(c *Config) { c.BindAddr = "127.0.0.1" }},
		{name: "bind port too big", edit: func(c *Config) { c.BindAddr = "127.0.0.1:70000" }},
		{name: "bind port not a number", edit: func(c *Config) { c.BindAddr = "127.0.0.1:gossip" }},
		{name: "advertise without port", edit: func(c *Config) { c.AdvertiseAddr = "10.0.0.1" }},
		{name: "advertise port with random bind port", edit: func(c *Config) { c.AdvertiseAddr = "10.0.0.1:7946" }},
		{name: "empty join entry", edit: func(c *Config) { c.Join = []string{"127.0.0.1:7946", ""} }},
		{name: "unknown profile", edit: func(c *Config) { c.Profile = "wan" }},
		{name: "label too long", edit: func(c *Config) { c.Label = strings.Repeat("l", 256) }},
		{name: "node name too long", edit: func(c *Config) { c.NodeName = strings.Repeat("n", MaxNodeNameLength+1) }},
		{name: "negative join retry", edit: func(c *Config) { c.JoinRetry.Initial = -time.Second }},
		{name: "join retry initial above max", edit: func(c *Config) { c.JoinRetry = JoinRetry{Initial: time.Minute, Max: time.Second} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good()
			tt.edit(&cfg)
			n, err := New(cfg, nil)
			if n != nil {
				n.Close()
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New = %v, want ErrInvalidConfig", err)
			}
			if tt.also != nil && !errors.Is(err, tt.also) {
				t.Fatalf("New = %v, want it to wrap %v too", err, tt.also)
			}
			if !strings.HasPrefix(err.Error(), "gossip: ") || strings.Count(err.Error(), "gossip: ") != 1 {
				t.Fatalf("error %q: want the package prefix once", err)
			}
		})
	}
}

func TestValidConfigEdges(t *testing.T) {
	cfg := fastConfig(Meta{Role: RoleGateway, Service: "edge"})
	cfg.SecretKey = make([]byte, 32)
	cfg.Label = strings.Repeat("l", 255)
	cfg.NodeName = "gw-1"
	cfg.AdvertiseAddr = "127.0.0.1:0"
	cfg.JoinRetry = JoinRetry{Initial: time.Minute} // Max follows Initial
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	c, _ := cfg.check()
	if c.retry.Max != time.Minute {
		t.Fatalf("JoinRetry.Max = %v, want Initial", c.retry.Max)
	}
	cfg.BindAddr = "localhost:0" // names are resolved
	n := startNode(t, cfg, nil)
	if n.Name() != "gw-1" || !strings.HasPrefix(n.LocalAddr(), "127.0.0.1:") {
		t.Fatalf("Name %q, LocalAddr %q", n.Name(), n.LocalAddr())
	}

	var zero Config
	zero.Meta = gatewayMeta()
	c, err := zero.check()
	if err != nil {
		t.Fatal(err)
	}
	if c.bindHost != "0.0.0.0" || c.bindPort != DefaultPort || c.profile != ProfileLAN ||
		c.retry != (JoinRetry{DefaultJoinRetryInitial, DefaultJoinRetryMax}) {
		t.Fatalf("defaults = %+v", c)
	}
}

func TestDefaultBindPortByRole(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		port int
	}{
		{"gateway", Config{Meta: gatewayMeta()}, DefaultPort},
		{"gateway that joins", Config{Meta: gatewayMeta(), Join: []string{"10.0.0.1:7946"}}, DefaultPort},
		{"instance seed", Config{Meta: instanceMeta("orders", "i-1", 1)}, DefaultPort},
		{"instance that joins", Config{Meta: instanceMeta("orders", "i-1", 1), Join: []string{"10.0.0.1:7946"}}, 0},
		{"instance with a bind", Config{Meta: instanceMeta("orders", "i-1", 1), Join: []string{"10.0.0.1:7946"}, BindAddr: ":7950"}, 7950},
	}
	for _, tt := range tests {
		c, err := tt.cfg.check()
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if c.bindHost != "0.0.0.0" || c.bindPort != tt.port {
			t.Errorf("%s: binds %s:%d, want 0.0.0.0:%d", tt.name, c.bindHost, c.bindPort, tt.port)
		}
	}
}

// TestWarnsWithoutKeyOffLoopback: a node without a key logs a warning at
// Start when it listens beyond loopback, and only then.
func TestWarnsWithoutKeyOffLoopback(t *testing.T) {
	const warning = "gossip has no key"
	tests := []struct {
		name string
		bind string
		key  []byte
		warn bool
	}{
		{"all interfaces, no key", "0.0.0.0:0", nil, true},
		{"all interfaces, a key", "0.0.0.0:0", make([]byte, 16), false},
		{"loopback, no key", "127.0.0.1:0", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out testutil.SyncBuffer
			cfg := fastConfig(gatewayMeta())
			cfg.BindAddr, cfg.SecretKey = tt.bind, tt.key
			cfg.AdvertiseAddr = "127.0.0.1:0" // the machine may have no private address
			cfg.Logger = zerolog.New(&out)
			startNode(t, cfg, nil)
			// Start logs synchronously: the line is there when it returns.
			if got := strings.Contains(out.String(), warning); got != tt.warn {
				t.Fatalf("warning logged: %v, want %v; log:\n%s", got, tt.warn, out.String())
			}
			if tt.warn && !strings.Contains(out.String(), `"level":"warn"`) {
				t.Fatalf("not a warning: %s", out.String())
			}
		})
	}
}

func TestDetectionTimeMatchesDoc(t *testing.T) {
	// The package documentation quotes these numbers; keep them in step.
	tests := []struct {
		profile         Profile
		n               int
		expected, bound time.Duration
	}{
		{ProfileFast, 3, 550 * time.Millisecond, 1000 * time.Millisecond},
		{ProfileFast, 5, 550 * time.Millisecond, 1000 * time.Millisecond},
		{ProfileFast, 20, 640300 * time.Microsecond, 1180600 * time.Microsecond},
		{ProfileFast, 50, 759400 * time.Microsecond, 1418800 * time.Microsecond},
		{ProfileLAN, 3, 6200 * time.Millisecond, 7400 * time.Millisecond},
		{ProfileLAN, 5, 6200 * time.Millisecond, 27400 * time.Millisecond},
		{ProfileLAN, 20, 7404 * time.Millisecond, 34624 * time.Millisecond},
		{ProfileLAN, 50, 8992 * time.Millisecond, 44152 * time.Millisecond},
		{"", 5, 6200 * time.Millisecond, 27400 * time.Millisecond},
		{"wan", 5, 0, 0},
	}
	for _, tt := range tests {
		exp, bound := tt.profile.DetectionTime(tt.n)
		if exp != tt.expected || bound != tt.bound {
			t.Errorf("%q N=%d: DetectionTime = %v, %v; want %v, %v", tt.profile, tt.n, exp, bound, tt.expected, tt.bound)
		}
	}
}

func TestMemberlistLogsGoToZerolog(t *testing.T) {
	var buf bytes.Buffer
	w := logWriter{zerolog.New(&buf)}
	if _, err := w.Write([]byte("[WARN] memberlist: Refuting a suspect message (from: b)\n")); err != nil {
		t.Fatal(err)
	}
	got := buf.String()
	for _, want := range []string{`"level":"debug"`, `"memberlist_level":"WARN"`, `"message":"Refuting a suspect message (from: b)"`} {
		if !strings.Contains(got, want) {
			t.Fatalf("log line %s lacks %s", got, want)
		}
	}
	buf.Reset()
	quiet := logWriter{zerolog.New(&buf).Level(zerolog.InfoLevel)}
	if n, err := quiet.Write([]byte("[DEBUG] memberlist: x\n")); n != 22 || err != nil || buf.Len() != 0 {
		t.Fatalf("Write at info level = %d, %v, wrote %q", n, err, buf.String())
	}
}
