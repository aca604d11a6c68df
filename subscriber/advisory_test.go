package subscriber_test

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
	"github.com/pushlb/pushlb/subscriber"
)

// advisoryRig is a NATS server whose accounts import the client-disconnect
// advisories (as the gateway's embedded one does) and a gateway that
// follows them.
type advisoryRig struct {
	srv *natstest.Server
	g   *gateway
}

func newAdvisoryRig(t *testing.T) *advisoryRig {
	t.Helper()
	return newAdvisoryRigWith(t, subscriber.Config{})
}

// newAdvisoryRigWith is newAdvisoryRig with a gateway configured by cfg
// (its advisory subject set).
func newAdvisoryRigWith(t *testing.T, cfg subscriber.Config) *advisoryRig {
	t.Helper()
	srv := natstest.Start(t, natstest.WithAdvisories(t, events.DefaultPrefix))
	cfg.AdvisorySubject = events.DisconnectAdvisorySubject(events.DefaultPrefix)
	g := startGateway(t, srv, cfg)
	// Start's check proves the advisories arrive.
	testutil.Eventually(t, "the advisories checked", func() bool {
		return g.sub.Stats().Advisories.State == subscriber.AdvisoriesOn
	})
	return &advisoryRig{srv: srv, g: g}
}

// served is an instance of orders whose address is a live HTTP server, and
// the publisher (over a connection of its own) that announced it.
type served struct {
	in  serverlist.Instance
	nc  *nats.Conn
	pub *publisher.Publisher
	srv *httptest.Server
}

func (r *advisoryRig) announce(t *testing.T, i int) *served {
	t.Helper()
	return r.announceOf(t, "orders", i, true)
}

// announceOf announces instance i of service; mirrored says whether the
// gateway follows the service (then it waits for its mirror to hold it).
// opts are added to the publisher's connection's.
func (r *advisoryRig) announceOf(t *testing.T, service string, i int, mirrored bool, opts ...nats.Option) *served {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(hs.Close)
	host, port, _ := net.SplitHostPort(hs.Listener.Addr().String())
	in := instance(service, i, time.Now().UnixNano())
	in.Host = host
	in.Port, _ = strconv.Atoi(port)
	nc := r.srv.Connect(t, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(20 * time.Millisecond)}, opts...)...)
	p, err := publisher.New(nc, openRegistry(t, nc), publisher.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Announce(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	s := &served{in: in, nc: nc, pub: p, srv: hs}
	if mirrored {
		r.g.waitMirrored(t, in)
	}
	return s
}

// handledLists returns the lists the gateway handled so far.
func (g *gateway) handledLists() []events.ListChanged {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.handled)
}

// connection returns the connection the instance's record names in the
// gateway's mirror.
func (r *advisoryRig) connection(in serverlist.Instance) serverlist.Connection {
	e, _ := r.g.sub.Mirror().Entry(in.Service, in.InstanceID)
	return e.Connection()
}

// TestAdvisoryRemovesACrashedInstance: the instance's process dies (its
// listener and its NATS connection close): the server's advisory of the
// connection's end makes the gateway probe the instance, find nothing and
// remove it at once, with the advisory as its cause, long before any
// lease could end. A withdrawn instance's connection ending concerns no
// record.
func TestAdvisoryRemovesACrashedInstance(t *testing.T) {
	r := newAdvisoryRig(t)
	crashed := r.announce(t, 1)
	kept := r.announce(t, 2)
	withdrawn := r.announce(t, 3)

	if err := withdrawn.pub.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	// Gone from the lists (its offline event) and from the mirror (its
	// record's removal, which may come a moment later): only then is its
	// connection's end about no record.
	testutil.Eventually(t, "the withdrawn instance gone", func() bool {
		_, mirrored := r.g.sub.Mirror().Entry("orders", withdrawn.in.InstanceID)
		return !mirrored && !r.g.live("orders", withdrawn.in.InstanceID)
	})
	received := r.g.sub.Stats().Advisories.Received
	withdrawn.nc.Close()
	testutil.Eventually(t, "the withdrawal's advisory handled", func() bool { return r.g.sub.Stats().Advisories.Received > received })
	if st := r.g.sub.Stats().Advisories; st.Matched != 0 {
		t.Fatalf("the advisory of a withdrawn instance's connection matched a record: %+v", st)
	}

	// The crash: the process's sockets close, its listener first here.
	crashed.srv.Close()
	crashed.nc.Close()
	r.g.waitCause(t, "orders", crashed.in.InstanceID, events.CauseAdvisory)
	st := r.g.sub.Stats()
	if a := st.Advisories; a.Matched != 1 || a.Removals != 1 || a.Probes["refused"] != 1 || a.Probes["alive"] != 0 {
		t.Fatalf("advisory stats %+v, want one match, one refused probe, one removal", a)
	}
	if ids := r.g.ids("orders"); !slices.Equal(ids, []string{kept.in.InstanceID}) {
		t.Fatalf("orders lists %v, want only %s", ids, kept.in.InstanceID)
	}
	// Its record is still there (its lease has not ended): the advisory
	// removed it, not the registry.
	if _, ok := r.g.sub.Mirror().Entry("orders", crashed.in.InstanceID); !ok {
		t.Fatal("the crashed instance's record is gone already; the test proves nothing")
	}
}

// TestAdvisoryBeforeTheRecord: an instance's process dies just after it
// announced, and its connection's advisory reaches the gateway before the
// record that names the connection (the online event listed it first).
// The advisory is kept a few seconds: the record's arrival starts the
// probe, which finds nothing, and the instance is removed by its
// advisory, not at its lease's end.
func TestAdvisoryBeforeTheRecord(t *testing.T) {
	r := newAdvisoryRig(t)
	kept := r.announce(t, 2)
	conn := r.srv.Connect(t)
	id, err := conn.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	in := instance("orders", 1, time.Now().UnixNano())
	in.NATSServerID, in.NATSClientID = conn.ConnectedServerId(), id
	dead := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	in.Host, in.Port = "127.0.0.1", dead.Listener.Addr().(*net.TCPAddr).Port
	dead.Close()

	received := r.g.sub.Stats().Advisories.Received
	conn.Close()
	testutil.Eventually(t, "the advisory handled", func() bool { return r.g.sub.Stats().Advisories.Received > received })
	if st := r.g.sub.Stats().Advisories; st.Matched != 0 {
		t.Fatalf("the advisory matched a record before there was one: %+v", st)
	}
	if _, err := openRegistry(t, r.srv.Connect(t)).Register(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	r.g.waitCause(t, "orders", in.InstanceID, events.CauseAdvisory)
	if a := r.g.sub.Stats().Advisories; a.Matched != 1 || a.Removals != 1 || a.Probes["refused"] != 1 {
		t.Fatalf("advisory stats %+v, want one match, one refused probe, one removal", a)
	}
	if ids := r.g.ids("orders"); !slices.Equal(ids, []string{kept.in.InstanceID}) {
		t.Fatalf("orders lists %v, want only %s", ids, kept.in.InstanceID)
	}
}

// TestAdvisoryOnAScopedGateway: a gateway that follows orders only is
// sent every advisory; one naming the connection of a service it does not
// follow matches no record (its mirror does not hold it) and costs a map
// lookup; a crash of a followed instance is removed by its advisory as on
// a gateway that follows everything.
func TestAdvisoryOnAScopedGateway(t *testing.T) {
	r := newAdvisoryRigWith(t, subscriber.Config{Services: []string{"orders"}})
	crashed := r.announce(t, 1)
	kept := r.announce(t, 2)
	other := r.announceOf(t, "billing", 3, false)

	received := r.g.sub.Stats().Advisories.Received
	other.srv.Close()
	other.nc.Close()
	testutil.Eventually(t, "the unfollowed instance's advisory handled", func() bool { return r.g.sub.Stats().Advisories.Received > received })
	if st := r.g.sub.Stats().Advisories; st.Matched != 0 || st.Removals != 0 {
		t.Fatalf("an advisory of an unfollowed service's connection matched: %+v", st)
	}

	crashed.srv.Close()
	crashed.nc.Close()
	r.g.waitCause(t, "orders", crashed.in.InstanceID, events.CauseAdvisory)
	if a := r.g.sub.Stats().Advisories; a.Matched != 1 || a.Removals != 1 {
		t.Fatalf("advisory stats %+v, want one match and one removal", a)
	}
	if ids := r.g.ids("orders"); !slices.Equal(ids, []string{kept.in.InstanceID}) {
		t.Fatalf("orders lists %v, want only %s", ids, kept.in.InstanceID)
	}
}

// TestAdvisoryOfALiveInstanceKeepsIt: the server closes a live instance's
// connection (a network blip, an operator's kick): the probe finds the
// instance answering and it stays listed throughout; its publisher
// reconnects and rewrites its record with the new connection.
func TestAdvisoryOfALiveInstanceKeepsIt(t *testing.T) {
	r := newAdvisoryRig(t)
	s := r.announce(t, 1)
	old := r.connection(s.in)
	if old.IsZero() {
		t.Fatal("the record names no connection")
	}
	handled := len(r.g.handledLists())
	if err := r.srv.NATS().DisconnectClientByID(old.ClientID); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the probe to end", func() bool { return r.g.sub.Stats().Advisories.Probes["alive"] == 1 })
	testutil.Eventually(t, "the record to name the new connection", func() bool {
		c := r.connection(s.in)
		return !c.IsZero() && c != old
	})
	st := r.g.sub.Stats().Advisories
	if st.Removals != 0 || st.Probes["refused"]+st.Probes["unreachable"] != 0 {
		t.Fatalf("advisory stats %+v: a live instance was found dead", st)
	}
	for _, lc := range r.g.handledLists()[handled:] {
		if lc.Service == "orders" && !slices.Contains(lc.InstanceIDs, s.in.InstanceID) {
			t.Fatalf("a list without the live instance was delivered: %+v", lc)
		}
	}
	if !r.g.live("orders", s.in.InstanceID) {
		t.Fatal("the live instance is not listed")
	}
}

// TestForgedAdvisoryRemovesNothing: an advisory that any client of the
// account publishes on the subject (where the deployment's permissions do
// not deny it) naming a live instance's connection only starts a probe,
// which finds the instance; a message that is not an advisory is counted
// and dropped.
func TestForgedAdvisoryRemovesNothing(t *testing.T) {
	r := newAdvisoryRig(t)
	s := r.announce(t, 1)
	c := r.connection(s.in)
	forger := r.srv.Connect(t)
	forged, err := json.Marshal(map[string]any{
		"type":   "io.nats.server.advisory.v1.client_disconnect",
		"server": map[string]any{"id": c.ServerID},
		"client": map[string]any{"id": c.ClientID},
		"reason": "Client Closed",
	})
	if err != nil {
		t.Fatal(err)
	}
	subject := events.DisconnectAdvisorySubject(events.DefaultPrefix)
	for _, m := range [][]byte{forged, []byte(`{"type":"something else"}`), []byte("not json")} {
		if err := forger.Publish(subject, m); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "the forged advisory probed", func() bool { return r.g.sub.Stats().Advisories.Probes["alive"] == 1 })
	testutil.Eventually(t, "the malformed messages counted", func() bool { return r.g.sub.Stats().Advisories.Malformed == 2 })
	if st := r.g.sub.Stats().Advisories; st.Removals != 0 {
		t.Fatalf("a forged advisory removed an instance: %+v", st)
	}
	if !r.g.live("orders", s.in.InstanceID) {
		t.Fatal("the live instance is not listed")
	}
}

// TestWithoutAdvisoriesTheCheckSaysSo: on a server without a system
// account nothing arrives on the subject: Start's check says so once, and
// crashes are left to gossip and leases.
func TestWithoutAdvisoriesTheCheckSaysSo(t *testing.T) {
	srv := natstest.Start(t)
	var logs testutil.SyncBuffer
	g := startGateway(t, srv, subscriber.Config{
		AdvisorySubject: events.DisconnectAdvisorySubject(events.DefaultPrefix),
		AdvisoryCheck:   200 * time.Millisecond,
		Logger:          zerolog.New(&logs).Level(zerolog.WarnLevel),
	})
	// The state changes before the line is written: wait for both.
	testutil.Eventually(t, "the check to give up, and say so", func() bool {
		return g.sub.Stats().Advisories.State == subscriber.AdvisoriesMissing &&
			strings.Contains(logs.String(), "crash detection falls back to gossip and leases")
	})
}

// TestAdvisoryRemovalIsUndoneByTheRecordsRewrite: a probe that finds
// nothing at a live instance (here its listener is gone, while its
// publisher lives) removes it; the removal holds for the record's revision
// only, so the publisher's rewrite of its record after it reconnects brings
// the instance back.
func TestAdvisoryRemovalIsUndoneByTheRecordsRewrite(t *testing.T) {
	r := newAdvisoryRig(t)
	s := r.announce(t, 1)
	old := r.connection(s.in)
	s.srv.Close() // the probe will be refused
	// An advisory of the record's connection (published here by a client,
	// so that the connection itself stays up until the removal is seen).
	forged, err := json.Marshal(map[string]any{
		"type":   "io.nats.server.advisory.v1.client_disconnect",
		"server": map[string]any{"id": old.ServerID},
		"client": map[string]any{"id": old.ClientID},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.srv.Connect(t).Publish(events.DisconnectAdvisorySubject(events.DefaultPrefix), forged); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the removal", func() bool {
		return r.g.sub.Stats().Advisories.Removals == 1 && !r.g.live("orders", s.in.InstanceID)
	})
	// The connection ends and comes back: the publisher rewrites its
	// record, a registry write after the removal. (The real advisory of
	// the connection's end finds the instance removed already.)
	if err := r.srv.NATS().DisconnectClientByID(old.ClientID); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the instance back", func() bool {
		return r.g.sub.Stats().RegistryRevivals == 1 && r.g.live("orders", s.in.InstanceID)
	})
	if c := r.connection(s.in); c == old || c.IsZero() {
		t.Fatalf("the record names %+v, want the new connection", c)
	}
	if n := r.g.sub.Stats().Advisories.Removals; n != 1 {
		t.Fatalf("%d advisory removals, want 1", n)
	}
}
