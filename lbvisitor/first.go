package lbvisitor

import (
	"context"
	"sync"
)

// TrackFirstLists starts recording the services whose list the Handler
// handled, and returns wait: it returns once every service of live (the
// subscriber's live sets at its start) with instances had a list handled,
// or when ctx ends. Call it before the subscriber starts, so that no list
// is missed; wait ends the recording.
func (s *Services) TrackFirstLists() (wait func(ctx context.Context, live map[string][]string) error) {
	f := &firstLists{seen: map[string]bool{}}
	s.first.Store(f)
	return func(ctx context.Context, live map[string][]string) error {
		defer s.first.CompareAndSwap(f, nil)
		return f.wait(ctx, live)
	}
}

// firstLists tells when every service live at start had its first list
// handled.
type firstLists struct {
	mu       sync.Mutex
	seen     map[string]bool // until wait ends
	pending  map[string]bool
	done     chan struct{} // closed when pending empties
	finished bool          // wait returned: nothing more to record
}

// handled records a service's list as handled.
func (f *firstLists) handled(service string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.finished {
		return
	}
	f.seen[service] = true
	if f.pending[service] {
		delete(f.pending, service)
		if len(f.pending) == 0 {
			close(f.done)
		}
	}
}

// wait returns when every service of live with instances had a list
// handled, or when ctx ends.
func (f *firstLists) wait(ctx context.Context, live map[string][]string) error {
	f.mu.Lock()
	f.pending, f.done = map[string]bool{}, make(chan struct{})
	for s, ids := range live {
		if len(ids) > 0 && !f.seen[s] {
			f.pending[s] = true
		}
	}
	if len(f.pending) == 0 {
		close(f.done)
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.finished, f.seen, f.pending = true, nil, nil
		f.mu.Unlock()
	}()
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
