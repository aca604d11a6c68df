package convergence

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
)

// Defaults of ReporterConfig.
const (
	// DefaultInterval is the least time between two reports.
	DefaultInterval = time.Second
	// MinInterval bounds Interval from below.
	MinInterval = 100 * time.Millisecond
	// heartbeatEvery: a report goes out every this many intervals even
	// when nothing changed, so that a Viewer tells a quiet gateway from a
	// gone one.
	heartbeatEvery = 10
)

// ReporterConfig configures a Reporter.
type ReporterConfig struct {
	// Prefix is the subject prefix (events.DefaultPrefix when empty).
	Prefix string
	// ID names the gateway: its reports go to <Prefix>.report.<ID>.
	// Required.
	ID string
	// Interval is the least time between two reports: one goes out at
	// most every Interval, when something was applied since the last, and
	// every 10 Intervals regardless. Zero means DefaultInterval (1 s); at
	// least MinInterval (100 ms).
	Interval time.Duration
	// Source returns what the gateway applied now, per service; it is
	// called once per Interval, from the Reporter's goroutine.
	Source func() map[string]Applied
	// Logger receives failures to publish (sampled).
	Logger zerolog.Logger
}

// Reporter publishes a gateway's reports. Build it with NewReporter, run
// it with Start, stop it with Close. It owns one goroutine.
type Reporter struct {
	nc  *nats.Conn
	cfg ReporterConfig
	log zerolog.Logger

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	seq  uint64 // the goroutine's own
	sent uint64 // reports published; read with Sent
	mu   sync.Mutex
}

// NewReporter checks cfg and returns a Reporter over nc. It starts nothing.
func NewReporter(nc *nats.Conn, cfg ReporterConfig) (*Reporter, error) {
	if nc == nil || cfg.Source == nil {
		return nil, errors.New("convergence: reporter: nil connection or source")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = events.DefaultPrefix
	}
	if err := events.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("convergence: reporter: %w", err)
	}
	if err := ValidateID(cfg.ID); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Interval < MinInterval {
		return nil, fmt.Errorf("convergence: reporter: interval %v is below %v", cfg.Interval, MinInterval)
	}
	return &Reporter{nc: nc, cfg: cfg, log: cfg.Logger.Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Minute}), stop: make(chan struct{})}, nil
}

// Start starts the reports: the first goes out at once.
func (r *Reporter) Start() {
	r.wg.Go(r.run)
}

// Close stops the reports and waits for the goroutine. Idempotent.
func (r *Reporter) Close() {
	r.once.Do(func() { close(r.stop) })
	r.wg.Wait()
}

// Sent counts the reports published.
func (r *Reporter) Sent() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent
}

func (r *Reporter) run() {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	var last map[string]Applied
	quiet := heartbeatEvery // a first report at once
	for {
		cur := r.cfg.Source()
		if quiet >= heartbeatEvery || !maps.Equal(cur, last) {
			if r.publish(cur) {
				last, quiet = cur, 0
			}
		} else {
			quiet++
		}
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
	}
}

// publish sends one report of services and reports whether it went out.
func (r *Reporter) publish(services map[string]Applied) bool {
	r.seq++
	rep := Report{V: Version, Gateway: r.cfg.ID, At: time.Now(), Seq: r.seq, Services: services}
	data, err := json.Marshal(rep)
	if err == nil && len(data) > MaxReportSize {
		data, err = r.truncated(rep)
	}
	if err == nil {
		err = r.nc.Publish(Subject(r.cfg.Prefix, r.cfg.ID), data)
	}
	if err != nil {
		r.log.Warn().Err(err).Str("gateway", r.cfg.ID).Msg("convergence report not sent")
		return false
	}
	r.mu.Lock()
	r.sent++
	r.mu.Unlock()
	return true
}

// truncated encodes rep with as many services, by name, as fit in
// MaxReportSize.
func (r *Reporter) truncated(rep Report) ([]byte, error) {
	names := slices.Sorted(maps.Keys(rep.Services))
	keep := len(names)
	for {
		keep = keep * 3 / 4
		part := make(map[string]Applied, keep)
		for _, n := range names[:keep] {
			part[n] = rep.Services[n]
		}
		out := rep
		out.Services, out.Truncated = part, true
		data, err := json.Marshal(out)
		if err != nil || len(data) <= MaxReportSize {
			return data, err
		}
	}
}
