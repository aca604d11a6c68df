package lbconfig_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/balancer/lbconfig"
)

// Whatever the input, LoadYAML returns a valid configuration or an error
// wrapping ErrInvalidConfig; it never panics.
func FuzzLoadYAML(f *testing.F) {
	for _, seed := range []string{
		loadExampleYAML,
		"defaults: {rule: Random, listOfServers: \"a:1, b:2\"}\n",
		"clients:\n  a: &a {breaker: {threshold: 4}}\n  b: {<<: *a, breaker: {factor: 1s}}\n",
		"clients:\n  a: {<<: [*x]}\n",
		"clients: {a: {ping: {kind: http, interval: 0}}}\n",
		"defaults: {retryTimeout: 30}\n---\n",
		"- a\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, src string) {
		cfg, err := lbconfig.LoadYAML(strings.NewReader(src))
		if err != nil {
			if !errors.Is(err, balancer.ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("loaded an invalid configuration: %v", err)
		}
	})
}
