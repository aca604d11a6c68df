package publisher

import (
	"testing"

	"github.com/pushlb/pushlb/serverlist"
)

// TestHolderProbeTarget: the probe of a holder connects to its gossip node
// when its record names one, else to its service address, and never to an
// address of the claimant's own.
func TestHolderProbeTarget(t *testing.T) {
	self := serverlist.Instance{Host: "10.0.0.1", Port: 8080, GossipAddr: "10.0.0.1:7946"}
	for _, tc := range []struct {
		held      serverlist.Instance
		addr, own string
	}{
		{serverlist.Instance{Host: "10.0.0.2", Port: 8080}, "10.0.0.2:8080", ""},
		{serverlist.Instance{Host: "10.0.0.1", Port: 8080}, "10.0.0.1:8080", "own"},
		{serverlist.Instance{Host: "10.0.0.1", Port: 8081}, "10.0.0.1:8081", ""},
		{serverlist.Instance{Host: "10.0.0.1", Port: 8080, GossipAddr: "10.0.0.1:7947"}, "10.0.0.1:7947", ""},
		{serverlist.Instance{Host: "10.0.0.2", Port: 8080, GossipAddr: "10.0.0.1:7946"}, "10.0.0.1:7946", "own"},
		{serverlist.Instance{Host: "HOST.example", Port: 8080}, "HOST.example:8080", ""},
	} {
		addr, _ := tc.held.ProbeTarget()
		if addr != tc.addr || ownAddress(addr, self) != (tc.own != "") {
			t.Errorf("holder %+v: target %s (own %v), want %s (own %v)", tc.held, addr, ownAddress(addr, self), tc.addr, tc.own != "")
		}
	}
	named := serverlist.Instance{Host: "host.example", Port: 8080}
	if !ownAddress("HOST.example:8080", named) || !ownAddress("[::1]:80", serverlist.Instance{Host: "0:0::1", Port: 80}) {
		t.Error("the same address written differently is not the claimant's own")
	}
}
