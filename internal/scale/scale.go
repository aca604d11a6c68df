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
	"fmt"
	"os"
	"strconv"
	"sync"
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
	js, err := jetstream.New(nc)
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
	return publish(nc, events.Online, ins)
}

// Deregister publishes the offline events of ins on nc, then purges their
// entries, as announcers do on a clean stop.
func (f *Fleet) Deregister(ctx context.Context, nc *nats.Conn, ins ...serverlist.Instance) error {
	if err := publish(nc, events.Offline, ins); err != nil {
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

func publish(nc *nats.Conn, k events.Kind, ins []serverlist.Instance) error {
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

// Put writes records to the bucket with asynchronous publishes (many in
// flight), and returns once the server acknowledged all of them.
func (f *Fleet) Put(ctx context.Context, recs []Record) error {
	bucket := "$KV." + serverlist.BucketName(events.DefaultPrefix) + "."
	const window = 4096
	for start := 0; start < len(recs); start += window {
		end := min(start+window, len(recs))
		futures := make([]jetstream.PubAckFuture, 0, end-start)
		for _, r := range recs[start:end] {
			fut, err := f.js.PublishAsync(bucket+r.key, r.val)
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

// Heartbeats re-puts recs, unchanged, spread evenly over every period, as
// a fleet's lease refreshes do, until ctx ends. It returns the number of
// puts sent.
func (f *Fleet) Heartbeats(ctx context.Context, recs []Record, period time.Duration) (int, error) {
	const tick = 10 * time.Millisecond
	perTick := max(1, len(recs)*int(tick)/int(period))
	bucket := "$KV." + serverlist.BucketName(events.DefaultPrefix) + "."
	t := time.NewTicker(tick)
	defer t.Stop()
	sent, next := 0, 0
	for {
		select {
		case <-ctx.Done():
			return sent, nil
		case <-t.C:
		}
		for range perTick {
			r := recs[next]
			next = (next + 1) % len(recs)
			if _, err := f.js.PublishAsync(bucket+r.key, r.val); err != nil {
				if ctx.Err() != nil {
					return sent, nil
				}
				return sent, err
			}
			sent++
		}
	}
}
