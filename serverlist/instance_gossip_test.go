package serverlist_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/serverlist"
)

// TestInstanceGossipFields: the gossip node's name and address are optional
// JSON fields (absent when empty, so other publishers' records are
// unchanged) and take part in Equal.
func TestInstanceGossipFields(t *testing.T) {
	t.Parallel()
	in := inst("orders", "h:orders:9001", 9001)
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "gossip") {
		t.Fatalf("an instance without gossip encodes gossip fields: %s", b)
	}
	g := in.Clone()
	g.GossipNode, g.GossipAddr = "orders/h:orders:9001/1", "127.0.0.1:40000"
	if g.Equal(in) {
		t.Fatal("a different gossip node reported equal")
	}
	if b, err = json.Marshal(g); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"gossipNode":"orders/h:orders:9001/1"`) || !strings.Contains(string(b), `"gossipAddr":"127.0.0.1:40000"`) {
		t.Fatalf("JSON %s lacks gossipNode or gossipAddr", b)
	}
	var back serverlist.Instance
	if err := json.Unmarshal(b, &back); err != nil || !back.Equal(g) {
		t.Fatalf("round trip: %+v, %v; want %+v", back, err, g)
	}
}
