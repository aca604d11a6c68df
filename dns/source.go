package dns

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/lbvisitor"
)

// Source gives the responder a service's instances.
//
// Servers returns the instances to answer with, in any order (the
// responder rotates them); an error wrapping ErrUnknownService (or
// pushlb.ErrUnknownService) is answered NXDOMAIN, any other SERVFAIL. It
// is called concurrently, one call per query, and must return once ctx is
// done. The servers are read, never modified.
type Source interface {
	Servers(ctx context.Context, service string) ([]*balancer.Server, error)
}

// ClientSource returns a Source over c's balancers: the reachable servers
// of a service (alive, breaker closed, not ejected), or its alive ones when
// none is reachable, as a balancer in panic balances over them all. A
// service c does not follow yet is followed (Client.Follow: it counts as a
// request) when c follows on request.
func ClientSource(c *pushlb.Client) Source { return clientSource{c} }

type clientSource struct{ c *pushlb.Client }

func (s clientSource) Servers(ctx context.Context, service string) ([]*balancer.Server, error) {
	b, err := s.c.Follow(ctx, service)
	if err != nil {
		if errors.Is(err, lbvisitor.ErrFollowBusy) {
			// Too many follows at once: not a verdict on the name.
			return nil, fmt.Errorf("dns: %s: %w", service, errBusy)
		}
		return nil, err
	}
	if r := b.Nearest(); len(r) > 0 { // the nearest region's, as picks go
		return r, nil
	}
	var alive []*balancer.Server
	for _, sv := range b.Servers() {
		if sv.Alive() {
			alive = append(alive, sv)
		}
	}
	return alive, nil
}

// errBusy is a Source's error for a query it declined under load: SERVFAIL.
var errBusy = errors.New("too many services being followed at once")

// Static is a Source of fixed lists, keyed by service name in lower case:
// for tests, and for comparing the responder with a static zone.
type Static map[string][]*balancer.Server

// NewStatic returns a Static of lists: the servers are copied, and each
// service name lower-cased.
func NewStatic(lists map[string][]balancer.Server) Static {
	s := make(Static, len(lists))
	for name, list := range lists {
		ptrs := make([]*balancer.Server, len(list))
		for i := range list {
			sv := list[i]
			ptrs[i] = &sv
		}
		s[strings.ToLower(name)] = ptrs
	}
	return s
}

// Servers returns the list of service, or an error wrapping
// ErrUnknownService.
func (s Static) Servers(_ context.Context, service string) ([]*balancer.Server, error) {
	list, ok := s[service]
	if !ok {
		return nil, fmt.Errorf("dns: %s: %w", service, ErrUnknownService)
	}
	return list, nil
}

var (
	_ Source = clientSource{}
	_ Source = Static(nil)
)
