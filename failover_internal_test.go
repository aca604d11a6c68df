package pushlb

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A stream's cluster information counts as a quorum behind its answer
// only with a leader that holds a majority of current replicas, itself
// included.
func TestQuorate(t *testing.T) {
	peer := func(current, offline bool) *jetstream.PeerInfo {
		return &jetstream.PeerInfo{Name: "p", Current: current, Offline: offline}
	}
	for _, tc := range []struct {
		name string
		c    *jetstream.ClusterInfo
		ok   bool
	}{
		{"no cluster (one server)", nil, true},
		{"R1 in a cluster", &jetstream.ClusterInfo{Leader: "n1"}, true},
		{"R1 without a leader", &jetstream.ClusterInfo{Name: "c"}, false},
		{"R3, both replicas current", &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer(true, false), peer(true, false)}}, true},
		{"R3, one replica current", &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer(true, false), peer(false, false)}}, true},
		{"R3, no replica current (a leader cut off)", &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer(false, false), peer(false, true)}}, false},
		{"R3, the current one offline", &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer(true, true), peer(false, false)}}, false},
		{"R3 without a leader (a replica answers)", &jetstream.ClusterInfo{Replicas: []*jetstream.PeerInfo{peer(true, false), peer(true, false)}}, false},
		{"R5, two of four current", &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer(true, false), peer(true, false), peer(false, false), peer(false, false)}}, true},
		{"R5, one of four current", &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{peer(true, false), peer(false, false), peer(false, false), peer(false, false)}}, false},
	} {
		if err := quorate(tc.c); (err == nil) != tc.ok {
			t.Errorf("%s: quorate = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// A probe that got no answer, or one without a quorum behind it, is
// unanswered; an answer that refuses (a lost bucket, a permission) is not:
// moving would not change it.
func TestUnanswered(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{nats.ErrTimeout, true},
		{nats.ErrNoResponders, true},
		{jetstream.ErrNoStreamResponse, true},
		{errNoQuorum, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{jetstream.ErrStreamNotFound, false},
		{&jetstream.APIError{Code: 403, Description: "permissions violation"}, false},
		{errors.New("other"), false},
	} {
		if got := unanswered(fmt.Errorf("pushlb: registry stream KV_x: %w", tc.err)); got != tc.want {
			t.Errorf("unanswered(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
