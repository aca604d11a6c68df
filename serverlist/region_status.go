package serverlist

// The regions' status keys as readers see them: a Replicator writes one
// per other region ("_pushlb.region.<name>", RegionStatus), and every
// process that shows regions reads them through a RegionWatch.

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/base/ctxutil"
)

// RegionStatus is what a region's registry says of its link to another
// region, written by the replicator that leads (the key
// "_pushlb.region.<name>"): whether the other region's bucket answers,
// since when, and when this was last written.
type RegionStatus struct {
	Region string    `json:"region"`
	Linked bool      `json:"linked"`
	Since  time.Time `json:"since"`
	// Written is when the replicator wrote the status; it writes it again
	// every ReplicatorConfig.StatusInterval.
	Written time.Time `json:"written"`
	// Node names the process that replicates.
	Node string `json:"node,omitempty"`
	// Copies is how many of the region's records this registry holds.
	Copies int64 `json:"copies"`
}

// RegionView is a region's status as a reader of the registry sees it.
type RegionView struct {
	RegionStatus
	// Stale reports that this registry's copies of the region may be out
	// of date: its link is cut, or no replicator has written its status
	// for three status intervals (none leads, or the one that leads
	// cannot write).
	Stale bool `json:"stale"`
	// Heard is when this reader last received the status.
	Heard time.Time `json:"heard"`
}

// RegionWatch keeps the status of the remote regions whose records a
// registry holds (RegionStatus), for dashboards and metrics. Its methods
// are safe for concurrent use.
type RegionWatch struct {
	reg      *Registry
	interval time.Duration
	log      zerolog.Logger
	cancel   context.CancelFunc
	done     chan struct{}

	mu      sync.Mutex
	regions map[string]RegionView
}

// WatchRegions starts watching reg's region status keys in a goroutine
// that runs until Close; ctx's values reach it, not its end (a start's
// deadline does not stop it). interval is the replicators' status
// interval (ReplicatorConfig.StatusInterval; zero: the default).
func WatchRegions(ctx context.Context, reg *Registry, interval time.Duration, log zerolog.Logger) *RegionWatch {
	if interval <= 0 {
		interval = DefaultRegionStatusInterval
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &RegionWatch{reg: reg, interval: interval, log: log, cancel: cancel, done: make(chan struct{}), regions: map[string]RegionView{}}
	go w.run(ctx)
	return w
}

// Close stops the watch and waits for its goroutine.
func (w *RegionWatch) Close() {
	w.cancel()
	<-w.done
}

// Regions returns the regions' views, by name.
func (w *RegionWatch) Regions() []RegionView {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	out := make([]RegionView, 0, len(w.regions))
	for _, name := range slices.Sorted(maps.Keys(w.regions)) {
		v := w.regions[name]
		v.Stale = !v.Linked || now.Sub(v.Heard) > 3*w.interval
		out = append(out, v)
	}
	return out
}

func (w *RegionWatch) run(ctx context.Context) {
	defer close(w.done)
	for ctx.Err() == nil {
		if err := w.watch(ctx); err != nil && ctx.Err() == nil {
			w.log.Debug().Err(err).Msg("serverlist: watch the regions' status")
			_ = ctxutil.Sleep(ctx, time.Second)
		}
	}
}

func (w *RegionWatch) watch(ctx context.Context) error {
	kw, err := w.reg.kv.WatchFiltered(ctx, []string{RegionStatusKeys})
	if err != nil {
		return err
	}
	defer stopWatcher(kw)
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-kw.Updates():
			if !ok {
				return errors.New("the watch ended")
			}
			if e != nil {
				w.apply(e)
			}
		}
	}
}

func (w *RegionWatch) apply(e jetstream.KeyValueEntry) {
	name := strings.TrimPrefix(e.Key(), regionStatusPrefix)
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(w.regions, name)
		return
	}
	var st RegionStatus
	if err := json.Unmarshal(e.Value(), &st); err != nil || st.Region != name {
		w.log.Warn().Str("key", e.Key()).Msg("serverlist: malformed region status")
		return
	}
	// When the server stored it (a status read at start may be old), by
	// the server's clock, never later than now.
	heard := e.Created()
	if now := time.Now(); heard.After(now) {
		heard = now
	}
	w.regions[name] = RegionView{RegionStatus: st, Heard: heard}
}
