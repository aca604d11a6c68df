package pushlbgrpc_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	lb "github.com/pushlb/pushlb/balancer"
	pushlbgrpc "github.com/pushlb/pushlb/grpc"
)

// The core's slowStart key is a gRPC key: the service config's JSON
// reaches the balancer's Config, defaults merged, values checked.
func TestParseConfigSlowStart(t *testing.T) {
	cfg, err := pushlbgrpc.ParseConfig(json.RawMessage(`{"rule":"RoundRobin","slowStart":{"window":"60s","aggression":2}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := lb.SlowStartConfig{Window: time.Minute, MinWeightPercent: 10, Aggression: 2}
	if got := cfg.Balancer.SlowStart; got != want {
		t.Fatalf("slowStart %+v, want %+v", got, want)
	}
	_, err = pushlbgrpc.ParseConfig(json.RawMessage(`{"slowStart":{"window":"60s","aggression":0}}`))
	if err == nil || !strings.Contains(err.Error(), "slowStart.aggression") {
		t.Fatalf("aggression 0: error %v, want one naming slowStart.aggression", err)
	}
}
