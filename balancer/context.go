package balancer

import (
	"context"
	"sync/atomic"
)

type zoneKeyType struct{}
type hashKeyType struct{}

// zonesForced turns true the first time WithZone is called in the process.
// Until then no context can carry a forced zone, so a pick skips looking
// for one: a context lookup walks the context's chain, which is long for
// an HTTP request's or an RPC's, and would cost more than the pick itself.
var zonesForced atomic.Bool

// choicesCarried is zonesForced or subsetsAsked (subset.go): one load for
// a pick's common case (Balancer.choose).
var choicesCarried atomic.Bool

// WithZone returns a context that makes Choose prefer zone for this call:
// only servers of that zone are chosen while it has any usable (alive, not
// tripped) server; otherwise the normal choice applies. It replaces the
// ThreadLocal zone of the Java stack and follows the request across
// goroutines.
func WithZone(ctx context.Context, zone string) context.Context {
	if !zonesForced.Load() {
		zonesForced.Store(true)
		choicesCarried.Store(true)
	}
	return context.WithValue(ctx, zoneKeyType{}, zone)
}

// ZoneFrom returns the zone set by WithZone.
func ZoneFrom(ctx context.Context) (string, bool) {
	if !zonesForced.Load() {
		return "", false
	}
	z, ok := ctx.Value(zoneKeyType{}).(string)
	return z, ok && z != ""
}

// WithKey returns a context carrying a key (a user, a session, a cart) for
// keyed rules such as Rendezvous, which send equal keys to the same server.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, hashKeyType{}, key)
}

// KeyFrom returns the key set by WithKey.
func KeyFrom(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(hashKeyType{}).(string)
	return k, ok
}
