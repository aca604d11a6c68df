package balancer

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// regioned returns count servers of region in zone, IDs "<region><zone><i>".
func regioned(count int, region, zone string, from int) []Server {
	out := servers(count, zone, from)
	for i := range out {
		out[i].ID = region + zone + out[i].ID
		out[i].Region = region
	}
	return out
}

func picked(counts map[string]int) []string {
	out := keys(counts)
	slices.Sort(out)
	return out
}

// Picks go to the nearest region with servers: the own one (Region empty
// or equal, in any case), then RegionPriority's order, then the others by
// name; each list change moves them.
func TestRegionsNearestFirst(t *testing.T) {
	own := append(regioned(1, "", "", 0), regioned(1, "EU", "", 1)...)
	us, ap, sa := regioned(2, "us", "", 10), regioned(1, "ap", "", 20), regioned(1, "sa", "", 30)
	tb := newTest(t, func(c *Config) {
		c.Region, c.RegionPriority, c.Rule = "eu", []string{"us"}, RuleRoundRobin
	}, slices.Concat(sa, ap, us, own))
	if got := picked(tb.pickCounts(t, 100)); !slices.Equal(got, []string{"EUs1", "s0"}) {
		t.Fatalf("picked %v, want the own region's EUs1 and s0", got)
	}
	steps := []struct {
		list []Server
		want []string
	}{
		{slices.Concat(sa, ap, us), []string{"uss10", "uss11"}}, // the listed region
		{slices.Concat(sa, ap), []string{"aps20"}},              // then by name
		{sa, []string{"sas30"}},
		{slices.Concat(sa, own[:1]), []string{"s0"}}, // back home at once
	}
	for i, s := range steps {
		if err := tb.SetServers(s.list); err != nil {
			t.Fatal(err)
		}
		if got := picked(tb.pickCounts(t, 100)); !slices.Equal(got, s.want) {
			t.Fatalf("step %d: picked %v, want %v", i, got, s.want)
		}
	}
}

// A region whose every server's breaker is open is not reachable: picks
// fail over to the next, and come back once a breaker closes.
func TestRegionFailsOverOnTrippedBreakers(t *testing.T) {
	list := slices.Concat(regioned(2, "eu", "", 0), regioned(2, "us", "", 10))
	tb := newTest(t, func(c *Config) { c.Region = "eu" }, list) // ZoneAvoidance: tripped servers skipped
	tb.trip(t, "eus0")
	if got := picked(tb.pickCounts(t, 100)); !slices.Equal(got, []string{"eus1"}) {
		t.Fatalf("one of two tripped: picked %v, want eus1", got)
	}
	tb.trip(t, "eus1")
	if got := picked(tb.pickCounts(t, 100)); !slices.Equal(got, []string{"uss10", "uss11"}) {
		t.Fatalf("both tripped: picked %v, want us's", got)
	}
	tb.clock.Advance(time.Minute) // past every blackout
	if got := picked(tb.pickCounts(t, 100)); !slices.Contains(got, "eus0") || slices.Contains(got, "uss10") {
		t.Fatalf("after the blackouts: picked %v, want eu's again", got)
	}
}

// Without Region the servers' regions are ignored.
func TestRegionsIgnoredWithoutRegion(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Rule = RuleRoundRobin }, slices.Concat(regioned(1, "eu", "", 0), regioned(1, "us", "", 10)))
	if got := picked(tb.pickCounts(t, 100)); len(got) != 2 {
		t.Fatalf("picked %v, want both", got)
	}
}

// LocalRegionOnly leaves other regions' servers out of the list: with no
// own server left, picks fail rather than leave the region.
func TestLocalRegionOnly(t *testing.T) {
	tb := newTest(t, func(c *Config) { c.Region, c.LocalRegionOnly = "eu", true },
		slices.Concat(regioned(1, "eu", "", 0), regioned(1, "us", "", 10)))
	if ids := serverIDs(tb.AllServers()); !slices.Equal(ids, []string{"eus0"}) {
		t.Fatalf("listed %v, want eus0 alone", ids)
	}
	if err := tb.SetServers(regioned(1, "us", "", 10)); err != nil {
		t.Fatal(err)
	}
	if s, err := tb.Choose(t.Context()); !errors.Is(err, ErrNoServers) {
		t.Fatalf("chose %v, %v; want ErrNoServers", s, err)
	}
}

// Within the nearest region the zone filter keeps the client's zone;
// another region's servers in that zone's name are not the client's.
func TestRegionZonesWithin(t *testing.T) {
	list := slices.Concat(regioned(2, "eu", "eu-1a", 0), regioned(2, "eu", "eu-1b", 10), regioned(2, "us", "us-1a", 20))
	tb := newTest(t, func(c *Config) { c.Region, c.Zone, c.Rule = "eu", "eu-1b", RuleRoundRobin }, list)
	if got := picked(tb.pickCounts(t, 100)); !slices.Equal(got, []string{"eueu-1bs10", "eueu-1bs11"}) {
		t.Fatalf("picked %v, want eu-1b's", got)
	}
	tb.trip(t, "eueu-1bs10", "eueu-1bs11")
	if got := picked(tb.pickCounts(t, 100)); !slices.Equal(got, []string{"eueu-1as0", "eueu-1as1"}) {
		t.Fatalf("eu-1b tripped: picked %v, want eu-1a's (the region before another)", got)
	}
	// Servers without zones in both regions share the empty zone: the
	// region still decides.
	if err := tb.SetServers(slices.Concat(regioned(1, "us", "", 20), regioned(1, "eu", "", 0))); err != nil {
		t.Fatal(err)
	}
	if got := picked(tb.pickCounts(t, 100)); !slices.Equal(got, []string{"eus0"}) {
		t.Fatalf("zones shared: picked %v, want eus0", got)
	}
}

func TestRegionConfigErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		set  func(*Config)
	}{
		{"own region listed", func(c *Config) { c.Region, c.RegionPriority = "eu", []string{"EU"} }},
		{"listed twice", func(c *Config) { c.Region, c.RegionPriority = "eu", []string{"us", "US"} }},
		{"empty entry", func(c *Config) { c.Region, c.RegionPriority = "eu", []string{""} }},
	} {
		cfg := DefaultConfig()
		c.set(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", c.name, err)
		}
	}
}

func serverIDs(list []*Server) []string {
	out := make([]string, len(list))
	for i, s := range list {
		out[i] = s.ID
	}
	slices.Sort(out)
	return out
}
