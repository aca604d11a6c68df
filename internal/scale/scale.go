// Package scale loads a fleet into a real JetStream registry and measures
// what a fleet costs the gateways: cold start until every balancer is full,
// the CPU a gateway spends on lease heartbeats, the propagation of one change
// to many gateways next to a raw NATS hop, and a churn wave until every
// gateway converges. The benchmarks in this package drive it, on one
// nats-server or a three-node cluster; docs/perf.md reports the figures and
// the commands.
package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// Size is the shape of a fleet.
type Size struct {
	Services, Instances, Gateways int
}

// Total is the number of instances.
func (s Size) Total() int { return s.Services * s.Instances }

// SizeFromEnv reads PUSHLB_SCALE ("services x instances x gateways", e.g.
// "1000x100x20", the figures of docs/perf.md), else returns def: CI runs the
// benchmarks once, small.
func SizeFromEnv(def Size) (Size, error) {
	v := os.Getenv("PUSHLB_SCALE")
	if v == "" {
		return def, nil
	}
	var s Size
	if _, err := fmt.Sscanf(v, "%dx%dx%d", &s.Services, &s.Instances, &s.Gateways); err != nil || s.Services < 1 || s.Instances < 1 || s.Gateways < 1 {
		return def, fmt.Errorf("PUSHLB_SCALE=%q: want SERVICESxINSTANCESxGATEWAYS, e.g. 1000x100x20", v)
	}
	return s, nil
}

// Fleet is a fleet's registry content: instance i of service s listens on
// 10.<s/256>.<s%256>.<i> (never dialled: the benchmarks measure the push
// path, not requests).
type Fleet struct {
	Size Size
	KV   jetstream.KeyValue
	js   jetstream.JetStream

	mu          sync.Mutex
	incarnation int64
}

// ServiceName is the name of service s.
func ServiceName(s int) string { return "svc-" + strconv.Itoa(s) }

// InstanceID is the ID of instance i of service s, in its generation gen
// (a churn wave replaces instances by a new generation).
func InstanceID(s, i, gen int) string { return fmt.Sprintf("svc-%d-i%d-g%d", s, i, gen) }

// Instance is the registry record of instance i of service s.
func (f *Fleet) Instance(s, i, gen int) serverlist.Instance {
	return serverlist.Instance{
		Service: ServiceName(s), InstanceID: InstanceID(s, i, gen),
		Host: fmt.Sprintf("10.%d.%d.%d", s/256%256, s%256, i%256), Port: 8000 + i/256,
		Zone: []string{"a", "b", "c"}[i%3], Incarnation: f.nextIncarnation(),
	}
}

func (f *Fleet) nextIncarnation() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.incarnation = max(f.incarnation+1, time.Now().UnixNano())
	return f.incarnation
}

// NewFleet opens the registry bucket of the default prefix with lease ttl
// (created when missing) and replicas.
func NewFleet(ctx context.Context, nc *nats.Conn, size Size, ttl time.Duration, replicas int) (*Fleet, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(putWindow))
	if err != nil {
		return nil, err
	}
	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{TTL: ttl, Replicas: replicas})
	if err != nil {
		return nil, err
	}
	return &Fleet{Size: size, KV: reg.KeyValue(), js: js}, nil
}

// Record is one registry entry to write: its key and JSON value.
type Record struct {
	key string
	val []byte
}

// Encode returns the registry entries of ins.
func Encode(ins ...serverlist.Instance) ([]Record, error) {
	out := make([]Record, len(ins))
	for i, in := range ins {
		key, err := serverlist.EncodeKey(in.Service, in.InstanceID)
		if err != nil {
			return nil, err
		}
		val, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		out[i] = Record{key, val}
	}
	return out, nil
}

// Generation returns the instances of generation gen of the whole fleet.
func (f *Fleet) Generation(gen int) []serverlist.Instance {
	out := make([]serverlist.Instance, 0, f.Size.Total())
	for s := range f.Size.Services {
		for i := range f.Size.Instances {
			out = append(out, f.Instance(s, i, gen))
		}
	}
	return out
}

// Register writes the entries of ins, then publishes their online events on
// nc, as announcers do.
func (f *Fleet) Register(ctx context.Context, nc *nats.Conn, ins ...serverlist.Instance) error {
	recs, err := Encode(ins...)
	if err != nil {
		return err
	}
	if err := f.Put(ctx, recs); err != nil {
		return err
	}
	return Announce(nc, events.Online, ins...)
}

// Deregister publishes the offline events of ins on nc, then purges their
// entries, as announcers do on a clean stop.
func (f *Fleet) Deregister(ctx context.Context, nc *nats.Conn, ins ...serverlist.Instance) error {
	if err := Announce(nc, events.Offline, ins...); err != nil {
		return err
	}
	recs, err := Encode(ins...)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	work := make(chan Record)
	for range 8 {
		wg.Go(func() {
			for r := range work {
				if err := f.KV.Purge(ctx, r.key); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for _, r := range recs {
		work <- r
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// Announce publishes the events of kind k (online or offline) of ins on nc,
// as announcers do, and flushes them.
func Announce(nc *nats.Conn, k events.Kind, ins ...serverlist.Instance) error {
	now := time.Now()
	for _, in := range ins {
		data, err := events.Encode(events.Event{Service: in.Service, InstanceID: in.InstanceID, Incarnation: in.Incarnation, At: now})
		if err != nil {
			return err
		}
		if err := nc.Publish(events.Subject(events.DefaultPrefix, in.Service, k), data); err != nil {
			return err
		}
	}
	return nc.Flush()
}

// putWindow is the number of puts Put keeps in flight.
const putWindow = 2048

// Put writes records to the bucket with asynchronous publishes (up to
// putWindow in flight), and returns once the server acknowledged all of
// them.
func (f *Fleet) Put(ctx context.Context, recs []Record) error {
	for start := 0; start < len(recs); start += putWindow {
		end := min(start+putWindow, len(recs))
		futures := make([]jetstream.PubAckFuture, 0, end-start)
		for _, r := range recs[start:end] {
			fut, err := f.js.PublishAsync(kvSubject(r.key), r.val)
			if err != nil {
				return err
			}
			futures = append(futures, fut)
		}
		for _, fut := range futures {
			select {
			case <-fut.Ok():
			case err := <-fut.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// kvSubject is the subject a put of key is published on.
func kvSubject(key string) string {
	return "$KV." + serverlist.BucketName(events.DefaultPrefix) + "." + key
}

// HeartbeatStats describe one run of Heartbeats.
type HeartbeatStats struct {
	// Elapsed is how long the puts were sent for.
	Elapsed time.Duration
	// Due is the number of puts the schedule asked for over Elapsed; Sent
	// those handed to the client, Acked those the server acknowledged,
	// Failed those it refused or did not acknowledge in time.
	Due, Sent, Acked, Failed int
	// Stalls counts the times the in-flight bound held the generator back
	// (the server acknowledged too slowly); MaxBehind is the most puts it
	// was behind its schedule.
	Stalls, MaxBehind int
}

// Rate is the acknowledged puts per second.
func (s HeartbeatStats) Rate() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Acked) / s.Elapsed.Seconds()
}

// KeptUp reports whether the generator sent at least 99 % of the puts its
// schedule asked for and the server acknowledged at least 99 % of those.
func (s HeartbeatStats) KeptUp() bool {
	return s.Due > 0 && 100*s.Sent >= 99*s.Due && 100*s.Acked >= 99*s.Sent
}

// heartbeatTick is the interval at which Heartbeats catches up with its
// schedule.
const heartbeatTick = 5 * time.Millisecond

// Heartbeats re-puts recs, unchanged, on nc, as a fleet's lease refreshes
// do: every record once per period, spread evenly, in a loop over recs,
// until ctx ends. It paces itself by the clock, not by counting ticks, so a
// slow tick is made up at the next one; at most maxInFlight puts await
// their acknowledgement (the client blocks beyond). It returns when ctx has
// ended and every put was acknowledged or failed (at most ackWait later).
func Heartbeats(ctx context.Context, nc *nats.Conn, recs []Record, period time.Duration, maxInFlight int) (HeartbeatStats, error) {
	var st HeartbeatStats
	if len(recs) == 0 || period <= 0 || maxInFlight < 1 {
		return st, fmt.Errorf("scale: heartbeats of %d records every %v, %d in flight", len(recs), period, maxInFlight)
	}
	var acked, failed atomic.Int64
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(maxInFlight),
		jetstream.WithPublishAsyncTimeout(ackWait),
		jetstream.WithPublishAsyncAckHandler(func(jetstream.JetStream, *nats.Msg, *jetstream.PubAck) { acked.Add(1) }),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
	if err != nil {
		return st, err
	}
	subjects := make([]string, len(recs))
	for i, r := range recs {
		subjects[i] = kvSubject(r.key)
	}
	t := time.NewTicker(heartbeatTick)
	defer t.Stop()
	start := time.Now()
	next := 0
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-t.C:
		}
		st.Due = int(int64(time.Since(start)) * int64(len(recs)) / int64(period))
		st.MaxBehind = max(st.MaxBehind, st.Due-st.Sent)
		for st.Sent < st.Due && ctx.Err() == nil {
			_, err := js.PublishAsync(subjects[next], recs[next].val, jetstream.WithStallWait(heartbeatTick))
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				st.Stalls++
				break // acknowledgements are late: try again at the next tick
			}
			if err != nil {
				return st, err
			}
			st.Sent++
			next = (next + 1) % len(recs)
		}
	}
	st.Elapsed = time.Since(start)
	st.Due = int(int64(st.Elapsed) * int64(len(recs)) / int64(period))
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * ackWait):
	}
	st.Acked, st.Failed = int(acked.Load()), int(failed.Load())
	return st, nil
}

// ackWait bounds the wait for one heartbeat's acknowledgement.
const ackWait = 5 * time.Second
