package lbconfig_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/balancer/lbconfig"
)

// The slowStart key: off by default, per client, its settings over the
// defaults (Envoy's: 10 %, aggression 1), each validated with an error
// naming its line and key path.
func TestLoadYAMLSlowStart(t *testing.T) {
	cfg := loadYAML(t, `
defaults:
  slowStart: {aggression: 2}
clients:
  orders:
    slowStart: {window: 60s}
  billing:
    slowStart: {window: 2m, minWeightPercent: 25, aggression: 0.5}
  other: {}
`)
	for name, want := range map[string]balancer.SlowStartConfig{
		"orders":  {Window: time.Minute, MinWeightPercent: 10, Aggression: 2},
		"billing": {Window: 2 * time.Minute, MinWeightPercent: 25, Aggression: 0.5},
		"other":   {MinWeightPercent: 10, Aggression: 2},
	} {
		if got := cfg.For(name).SlowStart; got != want {
			t.Errorf("%s: slowStart %+v, want %+v", name, got, want)
		}
	}

	for src, want := range map[string]string{
		"clients:\n  x:\n    slowStart: {window: 500ms}\n":                        "line 3: clients.x.slowStart.window: ",
		"clients:\n  x:\n    slowStart:\n      window: 1m\n      aggression: 0\n": "line 5: clients.x.slowStart.aggression: ",
		"clients:\n  x:\n    slowStart: {window: 1m, minWeightPercent: 150}\n":    "line 3: clients.x.slowStart.minWeightPercent: ",
		"clients:\n  x:\n    slowStart: {window: 1m, minWeight: 5}\n":             `clients.x.slowStart.minWeight: unknown key (did you mean "minWeightPercent"?)`,
		"clients:\n  x:\n    slowStart: {window: 60}\n":                           "clients.x.slowStart.window: \"60\" is not a duration",
	} {
		_, err := lbconfig.LoadYAML(strings.NewReader(src))
		if !errors.Is(err, balancer.ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one with %q", src, err, want)
		}
	}
}
