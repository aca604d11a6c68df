package publisher_test

import (
	"context"
	"testing"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

// TestRecordNamesItsConnection: the record names the NATS connection that
// holds it (server ID and client ID, as the server reports them), and
// after the server closes that connection and the publisher reconnects,
// the re-announcement rewrites the record with the new connection, so
// that an advisory of the new connection's end names the record.
func TestRecordNamesItsConnection(t *testing.T) {
	r := newRig(t, 5*time.Second)
	p, err := publisher.New(r.nc, r.reg, publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Announce(t.Context(), orders); err != nil {
		t.Fatal(err)
	}
	first := r.next(t)
	get := func() serverlist.Instance {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		in, err := r.reg.Get(ctx, orders.Service, orders.InstanceID)
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	cid, err := r.nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	want := serverlist.Connection{ServerID: r.nc.ConnectedServerId(), ClientID: cid}
	if got := get().Connection(); got != want || want.IsZero() {
		t.Fatalf("the record names connection %+v, want %+v", got, want)
	}

	// The server closes the connection (as an operator's kick, or a
	// network cut the server notices, would): the client reconnects with a
	// new client ID and the publisher re-announces.
	if err := r.srv.NATS().DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	if e := r.next(t); e.Kind != events.Online || e.Incarnation != first.Incarnation {
		t.Fatalf("after the reconnect want the same online again, got %+v", e)
	}
	// The online event follows the record's rewrite.
	now, err := r.nc.GetClientID()
	if err != nil || now == cid {
		t.Fatalf("client ID after the reconnect %d (%v), before %d", now, err, cid)
	}
	if got := get().Connection(); got.ClientID != now || got.ServerID != want.ServerID {
		t.Fatalf("after the reconnect the record names %+v, want client %d of %s", got, now, want.ServerID)
	}
}
