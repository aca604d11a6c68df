package lbvisitor

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/events"
)

// Registry holds one Visitor per service, created on the first ListChanged
// for it. Its Handle method is a subscriber.Handler.
type Registry struct {
	balancers balancer.Balancers
	res       Resolver
	log       zerolog.Logger

	mu       sync.Mutex
	visitors map[string]*Visitor
}

// NewRegistry builds a Registry over b (a *balancer.Factory, or any
// balancer.Balancers). It starts nothing.
func NewRegistry(b balancer.Balancers, res Resolver, log zerolog.Logger) *Registry {
	return &Registry{balancers: b, res: res, log: log, visitors: map[string]*Visitor{}}
}

// Visitor returns the visitor of service, creating it (and its balancer)
// once.
func (r *Registry) Visitor(service string) (*Visitor, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v := r.visitors[service]; v != nil {
		return v, nil
	}
	b, err := r.balancers.Get(service)
	if err != nil {
		return nil, fmt.Errorf("lbvisitor: balancer for %q: %w", service, err)
	}
	v := NewVisitor(b, r.res, r.log)
	r.visitors[service] = v
	return v, nil
}

// Services returns the services that have a visitor, sorted.
func (r *Registry) Services() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.visitors))
	for s := range r.visitors {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Handle applies lc to the visitor of its service.
func (r *Registry) Handle(ctx context.Context, lc events.ListChanged) error {
	v, err := r.Visitor(lc.Service)
	if err != nil {
		return err
	}
	return v.Apply(ctx, lc)
}
