package balancer

import (
	"testing"
	"unsafe"
)

// TestFactorySharesItsDefaults: the balancers of names without a
// configuration of their own share the factory's defaults (one copy, not
// one each); a name with its own configuration gets it; Config returns a
// copy that shares nothing with what the balancers hold.
func TestFactorySharesItsDefaults(t *testing.T) {
	cfg := DefaultClientsConfig()
	cfg.Defaults.ListOfServers = []string{"10.0.0.1:80"}
	orders := cloneConfig(cfg.Defaults)
	orders.Rule = RuleRoundRobin
	cfg.Clients["orders"] = orders
	f, err := NewFactory(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	get := func(name string) *Balancer {
		t.Helper()
		b, err := f.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b, o := get("a"), get("b"), get("orders")
	if a.cfg != b.cfg || a.cfg != f.defaults {
		t.Fatal("two balancers of the defaults hold a configuration each")
	}
	if o.cfg == a.cfg || o.cfg.Rule != RuleRoundRobin {
		t.Fatalf("orders holds %+v, want its own configuration", o.cfg.Rule)
	}
	got := a.Config()
	got.ListOfServers[0] = "10.0.0.2:80"
	if b.Config().ListOfServers[0] != "10.0.0.1:80" {
		t.Fatal("Config shares its slices with the balancers")
	}
	if size := unsafe.Sizeof(Balancer{}); size > 704 {
		t.Errorf("Balancer is %d bytes, want at most 704 (a 704-byte allocation)", size)
	}
}
