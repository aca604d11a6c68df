package publisher_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// TestEventsCarryTheRegion: every event of an instance with a region
// names it (online, down, offline), so that a gateway of another region
// leaves its own instance of the same ID alone; an instance without a
// region publishes events without one, as before regions.
func TestEventsCarryTheRegion(t *testing.T) {
	r := newRig(t, 5*time.Second)
	p, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	in := orders
	in.Region = "eu-west"
	if err := p.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	if e := r.next(t); e.Kind != events.Online || e.Region != "eu-west" {
		t.Fatalf("online event %+v, want region eu-west", e)
	}
	if err := p.MarkDown(t.Context(), "health check"); err != nil {
		t.Fatal(err)
	}
	if e := r.next(t); e.Kind != events.Offline || e.Region != "eu-west" {
		t.Fatalf("down's offline event %+v, want region eu-west", e)
	}
	if err := p.MarkUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	if e := r.next(t); e.Kind != events.Online || e.Region != "eu-west" {
		t.Fatalf("up's online event %+v, want region eu-west", e)
	}
	if err := p.Withdraw(t.Context(), "shutdown"); err != nil {
		t.Fatal(err)
	}
	if e := r.next(t); e.Kind != events.Offline || e.Region != "eu-west" {
		t.Fatalf("offline event %+v, want region eu-west", e)
	}

	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	if e := r.next(t); e.Kind != events.Online || e.Region != "" {
		t.Fatalf("online event of an instance without a region %+v", e)
	}
}

// TestRegionTheEventsCannotCarryIsRefused: a region that is not valid
// UTF-8 passes the record's length check but no event could carry it:
// Announce refuses it before writing anything.
func TestRegionTheEventsCannotCarryIsRefused(t *testing.T) {
	r := newRig(t, 5*time.Second)
	p, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	in := orders
	in.Region = "eu\xff"
	if err := p.Announce(t.Context(), in); !errors.Is(err, serverlist.ErrInvalidInstance) || !errors.Is(err, events.ErrInvalidField) {
		t.Fatalf("Announce = %v, want an invalid instance (region)", err)
	}
	if r.registered(t, in.InstanceID) {
		t.Fatal("a refused instance was registered")
	}
}
