package gateway

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/serverlist"
)

// TestRemoteRegionFlags: -remote-region's forms, repeated; the domain is
// the region's name unless a domain or a bucket alone is given.
func TestRemoteRegionFlags(t *testing.T) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"-nats", "nats://127.0.0.1:4222", "-region", "us", "-remote-region", "eu", "-remote-region", "ap=hub-ap", "-remote-region", "sa=/pushlb_lb_sa", "-remote-region", "af=af/reg"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := []serverlist.RemoteRegion{{Name: "eu", Domain: "eu"}, {Name: "ap", Domain: "hub-ap"}, {Name: "sa", Bucket: "pushlb_lb_sa"}, {Name: "af", Domain: "af", Bucket: "reg"}}
	if !slices.Equal(c.RemoteRegions, want) {
		t.Fatalf("remote regions %+v, want %+v", c.RemoteRegions, want)
	}
	if err := fs.Parse([]string{"-remote-region", "=x"}); err == nil {
		t.Fatal("-remote-region without a name: no error")
	}
}

func TestRemoteRegionConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no region", func(c *Config) { c.RemoteRegions = []serverlist.RemoteRegion{{Name: "eu"}} }, "remoteRegions: "},
		{"own region", func(c *Config) { c.Region, c.RemoteRegions = "eu", []serverlist.RemoteRegion{{Name: "eu"}} }, "is this registry's own"},
		{"bad name", func(c *Config) { c.Region, c.RemoteRegions = "us", []serverlist.RemoteRegion{{Name: "e u"}} }, "only letters"},
		{"no reaper", func(c *Config) {
			c.Region, c.Reaper, c.RemoteRegions = "us", false, []serverlist.RemoteRegion{{Name: "eu"}}
		}, "needs reaper"},
		{"embedded server", func(c *Config) {
			c.NATS.URL, c.Region, c.RemoteRegions = "", "us", []serverlist.RemoteRegion{{Name: "eu"}}
		}, "the embedded server is joined to none"},
	} {
		c := DefaultConfig()
		c.NATS.URL = "nats://127.0.0.1:4222"
		tc.edit(&c)
		err := c.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}
