package natsaccounts_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/app/natsaccounts"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
)

// advisory is the part of the server's client-disconnect advisory the
// tests read.
type advisory struct {
	Type   string `json:"type"`
	Server struct {
		ID string `json:"id"`
	} `json:"server"`
	Client struct {
		ID   uint64 `json:"id"`
		Name string `json:"name"`
		Acc  string `json:"acc"`
	} `json:"client"`
	Reason string `json:"reason"`
}

// followAdvisories subscribes nc to the imported advisories.
func followAdvisories(t *testing.T, nc *nats.Conn) chan advisory {
	t.Helper()
	ch := make(chan advisory, 16)
	if _, err := nc.Subscribe(events.DisconnectAdvisorySubject("lb"), func(m *nats.Msg) {
		var a advisory
		if err := json.Unmarshal(m.Data, &a); err != nil {
			t.Errorf("advisory %q: %v", m.Data, err)
			return
		}
		ch <- a
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// waitFor waits for the advisory of the connection (server, client).
func waitFor(t *testing.T, ch chan advisory, server string, client uint64) advisory {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case a := <-ch:
			if a.Server.ID == server && a.Client.ID == client {
				return a
			}
		case <-timeout:
			t.Fatalf("no disconnect advisory for client %d of %s", client, server)
		}
	}
}

// TestAdvisoryReachesTheAccount: a client without credentials lands in the
// application account, whose JetStream works, and the end of a connection
// reaches a subscriber of the import subject with the connection's server
// ID, client ID and name, as the client itself reads them.
func TestAdvisoryReachesTheAccount(t *testing.T) {
	srv := natstest.Start(t, natstest.WithAdvisories(t, "lb"))
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(t.Context()); err != nil {
		t.Fatalf("JetStream in the application account: %v", err)
	}
	ch := followAdvisories(t, nc)
	other, err := nats.Connect(srv.URL(), nats.Name("the instance"))
	if err != nil {
		t.Fatal(err)
	}
	cid, err := other.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	sid := other.ConnectedServerId()
	other.Close()
	a := waitFor(t, ch, sid, cid)
	if a.Type != "io.nats.server.advisory.v1.client_disconnect" || a.Client.Name != "the instance" || a.Client.Acc != natsaccounts.Account {
		t.Fatalf("advisory %+v", a)
	}
}

// TestAdvisoryCrossesTheCluster: on a three-node cluster, the end of a
// connection on one node reaches a subscriber on another. The subscriber's
// interest reaches the other nodes a moment after its subscription: a
// connection that ends before may go unreported, so connections are
// opened and closed until one's advisory arrives.
func TestAdvisoryCrossesTheCluster(t *testing.T) {
	c := natstest.StartCluster(t, 3, natstest.WithAdvisories(t, "lb"))
	ch := followAdvisories(t, c.Nodes[0].Connect(t))
	deadline := time.Now().Add(10 * time.Second)
	for {
		other, err := nats.Connect(c.Nodes[2].URL(), nats.DontRandomize())
		if err != nil {
			t.Fatal(err)
		}
		cid, err := other.GetClientID()
		if err != nil {
			t.Fatal(err)
		}
		sid := other.ConnectedServerId()
		if sid != c.Nodes[2].NATS().ID() {
			t.Fatalf("connected to %s, want node 3 (%s)", sid, c.Nodes[2].NATS().ID())
		}
		other.Close()
		select {
		case a := <-ch:
			if a.Server.ID == sid && a.Client.ID == cid {
				return
			}
		case <-time.After(time.Second):
		}
		if time.Now().After(deadline) {
			t.Fatal("no disconnect advisory from node 3 reached node 1")
		}
	}
}
