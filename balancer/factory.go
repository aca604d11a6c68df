package balancer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Balancers finds the balancer of a service (client) by name. *Factory
// implements it, building a balancer for any name on first use; a caller
// may also serve a fixed set or wrap a Factory to track what it builds.
//
// Get is called on the request path (lbhttp calls it once per request) and
// from list updates (lbvisitor), from any number of goroutines at once: an
// implementation must be safe for concurrent use and fast once a name is
// known. It returns a non-nil balancer or an error; the error means the
// service is unknown or cannot be served (ErrClosed after a Factory's
// Close). Callers must not Close the balancer they get: its owner does.
type Balancers interface {
	Get(name string) (*Balancer, error)
}

// ContextBalancers is a Balancers that may build a balancer on demand
// with some waiting (a service followed on the first request for it):
// GetContext waits for it within ctx, where Get answers at once. A
// caller that has a request's context (lbhttp.Transport) uses GetContext
// when its Balancers has it.
type ContextBalancers interface {
	Balancers
	GetContext(ctx context.Context, name string) (*Balancer, error)
}

// FactoryOption customises a Factory.
type FactoryOption func(*Factory) error

// WithBalancerOptions adds options applied to every balancer the factory
// builds (WithClock, WithRand, ...). Options holding an instance
// (WithRule, WithPinger) share that one instance among all balancers.
func WithBalancerOptions(opts ...Option) FactoryOption {
	return func(f *Factory) error {
		for i, o := range opts {
			if o == nil {
				return fmt.Errorf("%w: nil balancer option at index %d", ErrInvalidConfig, i)
			}
		}
		f.opts = append(f.opts, opts...)
		return nil
	}
}

// WithServerListProvider sets the function that gives each client its
// ServerList, for the polling updater (see WithServerList); it wins over
// a WithServerList passed to WithBalancerOptions. It may return nil for a
// client without one: that client uses its ListOfServers, or is fed by
// SetServers. It is called once per balancer built, without any lock held,
// possibly from several goroutines at once for different names.
func WithServerListProvider(p func(name string) ServerList) FactoryOption {
	return func(f *Factory) error {
		if p == nil {
			return fmt.Errorf("%w: nil server list provider", ErrInvalidConfig)
		}
		f.lists = p
		return nil
	}
}

// Factory builds each client's balancer on first use and caches it, as
// Ribbon's named client factory does. It implements Balancers. All methods
// are safe for concurrent use.
//
// NewFactory starts nothing. Get builds a name's balancer and starts it
// (Balancer.Start): from the first Get of a name on, that balancer's
// background work (the ping loop of a real Pinger, the polling updater of a
// ServerList or ListOfServers) runs until the factory's Close, which
// closes every balancer it built. Balancers fed by SetServers alone (the
// push path) have no background work.
//
// Get builds a balancer once per name: concurrent first calls for a name
// wait for one build and share its result. A failed build is not cached:
// the callers waiting for it get its error, and the next Get tries again.
// The configuration is validated by NewFactory, so a build fails only when
// an option or Start does; retrying costs a validation and no I/O.
type Factory struct {
	cfg *ClientsConfig
	// defaults is cfg.Defaults, which the balancers of every name
	// without a configuration of its own share.
	defaults *Config
	opts     []Option
	lists    func(name string) ServerList

	mu        sync.Mutex
	entries   map[string]*factoryEntry
	closed    bool
	closeDone chan struct{} // closed when Close has closed every balancer

	// waiting counts the Get and Close calls blocked on a build in
	// progress, so tests can see that they queued.
	waiting atomic.Int64
}

// factoryEntry is one name's balancer, built once.
type factoryEntry struct {
	ready chan struct{} // closed once b or err is set
	b     *Balancer
	err   error
}

// NewFactory returns a factory building balancers with cfg's
// configurations: a client's own, or the defaults for any other name. A
// nil cfg means DefaultClientsConfig(). The factory keeps a copy of cfg,
// which it validates.
func NewFactory(cfg *ClientsConfig, opts ...FactoryOption) (*Factory, error) {
	if cfg == nil {
		cfg = DefaultClientsConfig()
	}
	f := &Factory{cfg: cfg.Clone(), entries: make(map[string]*factoryEntry)}
	f.defaults = &f.cfg.Defaults
	if err := f.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("balancer factory: %w", err)
	}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("balancer factory: %w: nil option", ErrInvalidConfig)
		}
		if err := o(f); err != nil {
			return nil, fmt.Errorf("balancer factory: %w", err)
		}
	}
	return f, nil
}

// Get returns the balancer of the client name, building and starting it on
// first use (see Factory). It does no I/O: the first poll of a ServerList
// runs in the background. After Close it returns ErrClosed.
func (f *Factory) Get(name string) (*Balancer, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, ErrClosed
	}
	if e, ok := f.entries[name]; ok {
		f.mu.Unlock()
		f.wait(e)
		return e.b, e.err
	}
	e := &factoryEntry{ready: make(chan struct{})}
	f.entries[name] = e
	f.mu.Unlock()

	finished := false
	defer func() {
		if !finished {
			// The build panicked: release the waiters, let the panic go on.
			f.finish(name, e, nil, fmt.Errorf("balancer %q: build panicked", name))
		}
	}()
	b, err := f.build(name)
	finished = true
	return f.finish(name, e, b, err)
}

// wait waits for the build of e to finish.
func (f *Factory) wait(e *factoryEntry) {
	select {
	case <-e.ready:
		return
	default:
	}
	f.waiting.Add(1)
	defer f.waiting.Add(-1)
	<-e.ready
}

// build creates and starts a balancer; it runs without f.mu held.
func (f *Factory) build(name string) (*Balancer, error) {
	opts := slices.Clip(f.opts)
	if f.lists != nil {
		if l := f.lists(name); l != nil {
			opts = append(opts, WithServerList(l))
		}
	}
	cfg := f.defaults
	if own, ok := f.cfg.Clients[name]; ok {
		cfg = &own
	}
	b, err := newBalancer(name, cfg, opts...)
	if err != nil {
		return nil, err
	}
	if err := b.Start(context.Background()); err != nil {
		b.Close()
		return nil, fmt.Errorf("balancer %q: start: %w", name, err)
	}
	return b, nil
}

// finish records the outcome of a build and wakes its waiters. A failure
// is forgotten so the next Get retries; a balancer built while the factory
// was closing is closed at once.
func (f *Factory) finish(name string, e *factoryEntry, b *Balancer, err error) (*Balancer, error) {
	var stale *Balancer
	f.mu.Lock()
	switch {
	case err != nil:
		if f.entries[name] == e {
			delete(f.entries, name)
		}
	case f.closed:
		stale, b, err = b, nil, ErrClosed
	}
	e.b, e.err = b, err
	f.mu.Unlock()
	if stale != nil {
		stale.Close()
	}
	close(e.ready)
	return b, err
}

// Remove closes the balancer of name, if one was built, and forgets it: the
// next Get builds a new one. It waits for a build in progress. It reports
// whether there was a balancer.
func (f *Factory) Remove(name string) bool {
	f.mu.Lock()
	e, ok := f.entries[name]
	if ok {
		delete(f.entries, name)
	}
	f.mu.Unlock()
	if !ok {
		return false
	}
	f.wait(e)
	if e.b == nil {
		return false
	}
	e.b.Close()
	return true
}

// Names returns the names of the balancers built so far, sorted; empty
// after Close.
func (f *Factory) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.entries))
	for name, e := range f.entries {
		if e.b != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// Close closes every balancer built, after waiting for builds in progress,
// and makes later calls of Get return ErrClosed. It is idempotent: a second
// call waits for the first to finish and returns nil.
func (f *Factory) Close() error {
	f.mu.Lock()
	if f.closed {
		done := f.closeDone
		f.mu.Unlock()
		<-done
		return nil
	}
	f.closed = true
	f.closeDone = make(chan struct{})
	entries := make([]*factoryEntry, 0, len(f.entries))
	for _, e := range f.entries {
		entries = append(entries, e)
	}
	f.entries = make(map[string]*factoryEntry)
	f.mu.Unlock()

	var errs []error
	for _, e := range entries {
		f.wait(e)
		if e.b != nil {
			if err := e.b.Close(); err != nil {
				errs = append(errs, fmt.Errorf("balancer %q: %w", e.b.Name(), err))
			}
		}
	}
	close(f.closeDone)
	return errors.Join(errs...)
}

var _ Balancers = (*Factory)(nil)
