package pushlbk8s

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// Offline reasons of the bridge's events.
const (
	ReasonTerminating = "k8s: endpoint terminating"
	ReasonGone        = "k8s: endpoint gone or not ready"
)

// writeTimeout bounds one record's writes (and a read-back): a write the
// server never answers (a permission refused, NATS away) fails, is counted
// and retried, instead of holding a worker.
const writeTimeout = 10 * time.Second

// rec is a record the leader holds: as written, with its revision (0 when
// read back from a listing, unknown until the next write).
type rec struct {
	in  serverlist.Instance
	rev uint64
}

// svcState is what the leader holds of one Kubernetes Service. mu is held
// by the one reconciliation or renewal that works on it.
type svcState struct {
	mu      sync.Mutex
	listed  map[string]bool // pushlb services whose records were read back this term
	records map[string]rec  // by recordKey
}

func recordKey(service, id string) string { return service + "\x00" + id }

// writer writes one leadership term's records. Its methods may be called
// concurrently for different Services; one Service is worked on by one
// goroutine at a time (svcState.mu).
type writer struct {
	nc    *nats.Conn
	reg   *serverlist.Registry
	cfg   Config
	log   zerolog.Logger
	m     *metrics
	flush time.Duration

	mu      sync.Mutex
	states  map[string]*svcState // by "<namespace>/<name>" of the Service
	lastInc int64
}

func newWriter(nc *nats.Conn, reg *serverlist.Registry, cfg Config, m *metrics) *writer {
	return &writer{nc: nc, reg: reg, cfg: cfg, log: cfg.Logger, m: m, flush: 5 * time.Second, states: make(map[string]*svcState)}
}

func (w *writer) state(svcKey string) *svcState {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.states[svcKey]
	if st == nil {
		st = &svcState{listed: make(map[string]bool), records: make(map[string]rec)}
		w.states[svcKey] = st
	}
	return st
}

// incarnation returns a new incarnation: the time in ns, growing.
func (w *writer) incarnation() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := time.Now().UnixNano()
	if n <= w.lastInc {
		n = w.lastInc + 1
	}
	w.lastInc = n
	return n
}

// op is one change a reconciliation makes.
type op struct {
	in       serverlist.Instance // to write (Incarnation, Status set); for a removal, the record held
	cur      rec
	had      bool
	remove   bool
	draining bool
}

// apply makes the registry hold wants for the Service svcKey, announced
// under service: it writes what changed, in parallel, and publishes the
// events. It returns the first error; what succeeded stays done.
func (w *writer) apply(ctx context.Context, svcKey, service string, wants map[string]want) error {
	st := w.state(svcKey)
	st.mu.Lock()
	defer st.mu.Unlock()
	defer func() {
		// A Service gone with all its records is forgotten (lock order:
		// st.mu, then w.mu).
		if service == "" && len(st.records) == 0 {
			w.mu.Lock()
			if w.states[svcKey] == st {
				delete(w.states, svcKey)
			}
			w.mu.Unlock()
		}
	}()
	if service != "" && !st.listed[service] {
		if err := w.readBack(ctx, st, svcKey, service); err != nil {
			return err
		}
		st.listed[service] = true
	}
	var ops []op
	seen := make(map[string]bool, len(wants))
	for _, wt := range wants {
		k := recordKey(wt.in.Service, wt.in.InstanceID)
		seen[k] = true
		cur, had := st.records[k]
		c := wt.in
		if had && cur.in.Host == c.Host && cur.in.Port == c.Port && cur.in.Incarnation != 0 {
			c.Incarnation = cur.in.Incarnation
		} else {
			c.Incarnation = w.incarnation()
		}
		if wt.state == stateDraining {
			c.Status = serverlist.StatusDown
		}
		if had && cur.rev != 0 && c.Equal(cur.in) && c.Status == cur.in.Status {
			continue
		}
		ops = append(ops, op{in: c, cur: cur, had: had, draining: wt.state == stateDraining})
	}
	for k, cur := range st.records {
		if !seen[k] {
			ops = append(ops, op{in: cur.in, cur: cur, had: true, remove: true})
		}
	}
	if len(ops) == 0 {
		return nil
	}
	// Offline first, so that gateways stop sending before the record changes.
	offline := false
	for _, o := range ops {
		if o.remove || (o.draining && (!o.had || o.cur.in.Routable())) {
			reason := ReasonGone
			if o.draining {
				reason = ReasonTerminating
			}
			w.publish(o.in, events.Offline, reason)
			offline = true
		}
	}
	if offline {
		w.flushEvents(ctx)
	}
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		sem      = make(chan struct{}, w.cfg.WriteConcurrency)
	)
	for _, o := range ops {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			octx, cancel := context.WithTimeout(ctx, writeTimeout)
			r, err := w.do(octx, o)
			cancel()
			mu.Lock()
			defer mu.Unlock()
			k := recordKey(o.in.Service, o.in.InstanceID)
			switch {
			case errors.Is(err, errForeign):
				delete(st.records, k)
			case err != nil:
				w.m.errorInc()
				if firstErr == nil {
					firstErr = err
				}
			case o.remove:
				delete(st.records, k)
			default:
				st.records[k] = r
				if r.in.Routable() {
					w.publish(r.in, events.Online, "")
				}
			}
		})
	}
	wg.Wait()
	w.flushEvents(ctx)
	return firstErr
}

// do carries one op out.
func (w *writer) do(ctx context.Context, o op) (rec, error) {
	if o.remove {
		return rec{}, w.remove(ctx, o.cur)
	}
	if o.had && o.cur.rev != 0 {
		rev, err := w.reg.Update(ctx, o.in, o.cur.rev)
		if err == nil {
			w.m.write("update")
			return rec{in: o.in, rev: rev}, nil
		}
		if !errors.Is(err, serverlist.ErrRevisionMismatch) {
			return rec{}, err
		}
	}
	return w.assert(ctx, o.in, "update")
}

// assert writes in whatever the key holds, unless another owner holds it:
// a create-only write, or a compare-and-set over the bridge's own record
// (keeping its incarnation when it names the same address). updateOp is
// the metric label of an overwrite.
func (w *writer) assert(ctx context.Context, in serverlist.Instance, updateOp string) (rec, error) {
	for range 8 {
		rev, err := w.reg.Create(ctx, in)
		if err == nil {
			w.m.write("create")
			return rec{in: in, rev: rev}, nil
		}
		if !errors.Is(err, serverlist.ErrExists) {
			return rec{}, err
		}
		e, err := w.reg.GetEntry(ctx, in.Service, in.InstanceID)
		switch {
		case errors.Is(err, serverlist.ErrNotFound):
			continue
		case errors.Is(err, serverlist.ErrInvalidInstance):
			// Malformed: not provably the bridge's.
			return rec{}, w.foreign(in, "malformed")
		case err != nil:
			return rec{}, err
		case e.Owner != w.cfg.Owner:
			return rec{}, w.foreign(in, e.Owner)
		}
		if e.Host == in.Host && e.Port == in.Port && e.Incarnation != 0 {
			in.Incarnation = e.Incarnation
		}
		rev, err = w.reg.Update(ctx, in, e.Revision)
		if err == nil {
			w.m.write(updateOp)
			return rec{in: in, rev: rev}, nil
		}
		if !errors.Is(err, serverlist.ErrRevisionMismatch) {
			return rec{}, err
		}
	}
	return rec{}, fmt.Errorf("pushlbk8s: %s/%s kept changing", in.Service, in.InstanceID)
}

func (w *writer) foreign(in serverlist.Instance, owner string) error {
	w.m.foreignInc()
	w.log.Warn().Str("service", in.Service).Str("id", in.InstanceID).Str("owner", owner).
		Msg("pushlbk8s: the record is held by another owner; left alone")
	return fmt.Errorf("%w: %s/%s (owner %q)", errForeign, in.Service, in.InstanceID, owner)
}

// remove deletes the bridge's record: at its revision when known, else
// only if it is still the bridge's.
func (w *writer) remove(ctx context.Context, cur rec) error {
	if cur.rev != 0 {
		err := w.reg.DeregisterRevision(ctx, cur.in.Service, cur.in.InstanceID, cur.rev)
		if err == nil {
			w.m.write("delete")
			return nil
		}
		if !errors.Is(err, serverlist.ErrRevisionMismatch) {
			return err
		}
	}
	if err := w.reg.DeregisterOwned(ctx, cur.in.Service, cur.in.InstanceID, w.cfg.Owner); err != nil {
		return err
	}
	w.m.write("delete")
	return nil
}

// readBack adds to st the records of service that the bridge wrote for
// svcKey (a previous leader's, or this replica's in an earlier term), so
// that this term re-asserts or removes them.
func (w *writer) readBack(ctx context.Context, st *svcState, svcKey, service string) error {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	list, err := w.reg.List(ctx, service)
	if err != nil {
		return fmt.Errorf("pushlbk8s: read back %s: %w", service, err)
	}
	for _, in := range list {
		if in.Owner != w.cfg.Owner || in.Metadata[MetaService] != svcKey {
			continue
		}
		k := recordKey(in.Service, in.InstanceID)
		if _, ok := st.records[k]; !ok {
			st.records[k] = rec{in: in}
		}
	}
	return nil
}

// renew re-puts every record held (their lease). A record found changed
// is asserted again (re-created when it expired or was removed, and
// announced again); one of another owner is dropped.
func (w *writer) renew(ctx context.Context) {
	w.mu.Lock()
	states := make([]*svcState, 0, len(w.states))
	for _, st := range w.states {
		states = append(states, st)
	}
	w.mu.Unlock()
	sem := make(chan struct{}, w.cfg.WriteConcurrency)
	for _, st := range states {
		if ctx.Err() != nil {
			return
		}
		st.mu.Lock()
		var (
			mu   sync.Mutex
			wg   sync.WaitGroup
			held []rec
		)
		for _, cur := range st.records {
			if cur.rev != 0 { // 0: read back, not yet asserted this term
				held = append(held, cur)
			}
		}
		// The goroutines write st.records under mu; this loop reads held.
		for _, cur := range held {
			k := recordKey(cur.in.Service, cur.in.InstanceID)
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				octx, cancel := context.WithTimeout(ctx, writeTimeout)
				r, err := w.renewOne(octx, cur)
				cancel()
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, errForeign):
					delete(st.records, k)
				case err != nil:
					w.m.errorInc()
					if ctx.Err() == nil {
						w.log.Warn().Err(err).Str("service", cur.in.Service).Str("id", cur.in.InstanceID).Msg("pushlbk8s: lease renewal failed")
					}
				default:
					st.records[k] = r
				}
			})
		}
		wg.Wait()
		st.mu.Unlock()
	}
	w.flushEvents(ctx)
}

func (w *writer) renewOne(ctx context.Context, cur rec) (rec, error) {
	rev, err := w.reg.Update(ctx, cur.in, cur.rev)
	if err == nil {
		w.m.write("renew")
		return rec{in: cur.in, rev: rev}, nil
	}
	if !errors.Is(err, serverlist.ErrRevisionMismatch) {
		return rec{}, err
	}
	r, err := w.assert(ctx, cur.in, "renew")
	if err == nil && r.in.Routable() {
		w.publish(r.in, events.Online, "")
	}
	return r, err
}

// publish sends one event without waiting; flushEvents waits for the
// server to have them.
func (w *writer) publish(in serverlist.Instance, k events.Kind, reason string) {
	subject, data, err := events.EncodeMessage(w.cfg.Prefix, events.Event{
		Kind: k, Service: in.Service, InstanceID: in.InstanceID,
		Incarnation: in.Incarnation, At: time.Now(), Reason: reason,
	})
	if err == nil {
		err = w.nc.Publish(subject, data)
	}
	if err != nil {
		w.log.Warn().Err(err).Str("service", in.Service).Str("id", in.InstanceID).Msg("pushlbk8s: event not published (the registry still tells gateways)")
	}
}

func (w *writer) flushEvents(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, w.flush)
	defer cancel()
	if err := w.nc.FlushWithContext(ctx); err != nil && ctx.Err() == nil {
		w.log.Warn().Err(err).Msg("pushlbk8s: flushing events")
	}
}
