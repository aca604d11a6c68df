package pushlbgrpc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/pushlb/pushlb"
	lb "github.com/pushlb/pushlb/balancer"
	pushlbgrpc "github.com/pushlb/pushlb/grpc"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

func TestParseConfigHintKey(t *testing.T) {
	for js, want := range map[string]string{
		`{}`:                       "",
		`{"hintKey":"X-Lane"}`:     "x-lane",
		`{"hintKey":"-"}`:          "-",
		`{"hintKey":"x_lane.v2"}`:  "x_lane.v2",
		`{"hintKey":""}`:           "",
		`{"rule":"RoundRobin"}`:    "",
		`{"hintKey":"x-pushlb-h"}`: "x-pushlb-h",
	} {
		cfg, err := pushlbgrpc.ParseConfig(json.RawMessage(js))
		if err != nil || cfg.HintKey != want {
			t.Errorf("%s: hintKey %q, %v; want %q", js, cfg.HintKey, err, want)
		}
	}
	for _, js := range []string{`{"hintKey":3}`, `{"hintKey":"x lane"}`, `{"hintKey":"lane-bin"}`, `{"hintKey":"x:lane"}`} {
		if _, err := pushlbgrpc.ParseConfig(json.RawMessage(js)); err == nil || !strings.Contains(err.Error(), "hintKey") {
			t.Errorf("%s: %v, want an error naming hintKey", js, err)
		}
	}
}

// hinted starts two servers announced with metadata hint=canary and two
// without, as instances of orders, and returns the addresses of each
// pair and the canaries' publishers.
func hinted(t *testing.T) (c *pushlb.Client, canaries, others []string, pubs []withdrawer) {
	t.Helper()
	srv := natstest.Start(t)
	c = startClient(t, srv)
	nc := srv.Connect(t)
	for i := range 4 {
		ts := newTestServer(t)
		in := serverlist.Instance{Service: "orders", InstanceID: fmt.Sprintf("o%d", i), Zone: "z1"}
		if i < 2 {
			in.Metadata = map[string]string{lb.HintKey: "canary"}
			canaries = append(canaries, ts.addr)
			pubs = append(pubs, testpub.AnnounceAt(t, nc, ts.addr, in))
		} else {
			others = append(others, ts.addr)
			testpub.AnnounceAt(t, nc, ts.addr, in)
		}
	}
	return c, canaries, others, pubs
}

// TestBalancerHints: an RPC whose metadata carries the hint key (or whose
// context carries lb.WithHint) goes to the servers announced with that
// hint, every one of them; one without a hint, or with a hint no server
// carries, goes to every server; when the hinted servers leave, hinted
// RPCs fall back to the others without failing. Real gRPC servers, real
// NATS.
func TestBalancerHints(t *testing.T) {
	c, canaries, others, pubs := hinted(t)
	all := append(append([]string{}, canaries...), others...)
	conn := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(`{"rule":"RoundRobin"}`, false))
	waitReady(t, conn, all...)

	byMetadata := metadata.AppendToOutgoingContext(t.Context(), pushlbgrpc.DefaultHintKey, "canary")
	if seen := spread(t, byMetadata, conn, 40); !testutil.Exactly(seen, canaries) {
		t.Fatalf("hinted by metadata: %v, want both canaries %v and nothing else", seen, canaries)
	}
	if seen := spread(t, pushlbgrpc.WithCallHint(t.Context(), "canary"), conn, 40); !testutil.Exactly(seen, canaries) {
		t.Fatalf("hinted by the context: %v, want both canaries %v and nothing else", seen, canaries)
	}
	if seen := spread(t, t.Context(), conn, 40); !testutil.Exactly(seen, all) {
		t.Fatalf("no hint: %v, want every server", seen)
	}
	nobody := metadata.AppendToOutgoingContext(t.Context(), pushlbgrpc.DefaultHintKey, "nobody")
	if seen := spread(t, nobody, conn, 40); !testutil.Exactly(seen, all) {
		t.Fatalf("a hint no server carries: %v, want every server (fallback)", seen)
	}
	// The metadata's hint wins over the context's.
	both := metadata.AppendToOutgoingContext(pushlbgrpc.WithCallHint(t.Context(), "nobody"), pushlbgrpc.DefaultHintKey, "canary")
	if seen := spread(t, both, conn, 20); !testutil.Exactly(seen, canaries) {
		t.Fatalf("hinted by metadata over the context's: %v, want the canaries", seen)
	}

	// Another key, and none.
	lane := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(`{"rule":"RoundRobin","hintKey":"X-Lane"}`, false))
	waitReady(t, lane, all...)
	if seen := spread(t, metadata.AppendToOutgoingContext(t.Context(), "x-lane", "canary"), lane, 40); !testutil.Exactly(seen, canaries) {
		t.Fatalf("hinted under hintKey x-lane: %v, want the canaries", seen)
	}
	if seen := spread(t, byMetadata, lane, 40); !testutil.Exactly(seen, all) {
		t.Fatalf("the default key under hintKey x-lane: %v, want every server", seen)
	}
	off := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(`{"rule":"RoundRobin","hintKey":"-"}`, false))
	waitReady(t, off, all...)
	if seen := spread(t, byMetadata, off, 40); !testutil.Exactly(seen, all) {
		t.Fatalf("hintKey -: %v, want every server", seen)
	}

	// The canaries leave: hinted RPCs fall back to the others, none fails.
	for _, p := range pubs {
		if err := p.Withdraw(t.Context(), "test"); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "the canaries' withdrawal to reach the balancer", func() bool {
		return testutil.Exactly(spread(t, byMetadata, conn, 4), others)
	})
	if seen := spread(t, byMetadata, conn, 40); !testutil.Exactly(seen, others) {
		t.Fatalf("hinted, the canaries gone: %v, want the others %v", seen, others)
	}
}

// withdrawer is a publisher as the tests use it.
type withdrawer interface {
	Withdraw(context.Context, string) error
}

// TestBalancerHintJoinsLater: a list without any hinted server makes the
// picker skip the RPC's metadata; a canary announced afterwards gets the
// hinted RPCs at once, and the others none of them.
func TestBalancerHintJoinsLater(t *testing.T) {
	srv := natstest.Start(t)
	c := startClient(t, srv)
	nc := srv.Connect(t)
	others := announceServers(t, nc, 2)
	conn := dialPushlb(t, c, "pushlb:///orders", "", pushlbConfig(`{"rule":"RoundRobin"}`, false))
	waitReady(t, conn, others...)
	byMetadata := metadata.AppendToOutgoingContext(t.Context(), pushlbgrpc.DefaultHintKey, "canary")
	if seen := spread(t, byMetadata, conn, 20); !testutil.Exactly(seen, others) {
		t.Fatalf("hinted, no canary yet: %v, want every server %v", seen, others)
	}

	canary := newTestServer(t)
	testpub.AnnounceAt(t, nc, canary.addr, serverlist.Instance{Service: "orders", InstanceID: "canary", Zone: "z1",
		Metadata: map[string]string{lb.HintKey: "canary"}})
	waitReady(t, conn, append([]string{canary.addr}, others...)...)
	if seen := spread(t, byMetadata, conn, 20); !testutil.Exactly(seen, []string{canary.addr}) {
		t.Fatalf("hinted, the canary announced: %v, want only %s", seen, canary.addr)
	}
	if seen := spread(t, t.Context(), conn, 30); !testutil.Exactly(seen, append([]string{canary.addr}, others...)) {
		t.Fatalf("no hint: %v, want every server", seen)
	}
}
