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
	"slices"
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
	// reg writes the leases' messages exactly as a publisher's registry
	// does (Registry.LeaseMessage): scheduled when the bucket allows it.
	reg *serverlist.Registry

	mu          sync.Mutex
	incarnation int64
	leaseRevs   map[string]uint64 // lease subject -> revision of its last acknowledged write
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
	return &Fleet{Size: size, KV: reg.KeyValue(), js: js, reg: reg, leaseRevs: make(map[string]uint64)}, nil
}

// CreatePlainBucket creates the registry bucket of the default prefix as
// pushlb did before scheduled leases (no message schedules), so that a
// fleet opened on it afterwards writes plain leases, as publishers of that
// release do: the "before" of docs/perf.md's reaper figures. Run before
// NewFleet; a gateway whose reaper leads then allows schedules on it, but
// the fleet's leases stay plain.
func CreatePlainBucket(ctx context.Context, nc *nats.Conn, ttl time.Duration, replicas int) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: serverlist.BucketName(events.DefaultPrefix), History: 1, TTL: ttl, LimitMarkerTTL: ttl,
		MaxValueSize: serverlist.MaxValueSize, Replicas: replicas,
	})
	return err
}

// Load opens the registry as NewFleet does and registers generation 0 of
// the fleet, as its announcers would (records, leases, online events). It
// returns the fleet and the instances registered.
func Load(ctx context.Context, nc *nats.Conn, size Size, ttl time.Duration, replicas int) (*Fleet, []serverlist.Instance, error) {
	f, err := NewFleet(ctx, nc, size, ttl, replicas)
	if err != nil {
		return nil, nil, err
	}
	ins := f.Generation(0)
	if err := f.Register(ctx, nc, ins...); err != nil {
		return nil, nil, err
	}
	return f, ins, nil
}

// Record is one registry entry to write: its key and JSON value, and the
// instance it names.
type Record struct {
	key, service, id string
	val              []byte
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
		out[i] = Record{key: key, service: in.Service, id: in.InstanceID, val: val}
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
	return f.Purge(ctx, recs)
}

// Purge removes the entries of recs as Registry.DeregisterOwned does (a
// purge marker that rolls the key's history up, for the record, then for
// its lease), with asynchronous publishes (up to putWindow in flight, as
// many announcers stopping at once), and returns once the server
// acknowledged all of them.
func (f *Fleet) Purge(ctx context.Context, recs []Record) error {
	msgs := make([]*nats.Msg, 0, 2*len(recs))
	for _, r := range recs {
		for _, key := range []string{r.key, r.key + leaseSuffix} {
			msgs = append(msgs, &nats.Msg{Subject: kvSubject(key), Header: nats.Header{
				"KV-Operation":      []string{"PURGE"},
				jetstream.MsgRollup: []string{jetstream.MsgRollupSubject},
			}})
		}
	}
	_, err := f.publish(ctx, msgs)
	return err
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

// Put writes records to the bucket as Registry.Claim does, each record
// marked to never age out and followed by its lease (Registry.PutLease's
// message), with asynchronous publishes (up to putWindow in flight), and
// returns once the server acknowledged all of them. It keeps the leases'
// revisions, which Heartbeats renews by compare-and-set.
func (f *Fleet) Put(ctx context.Context, recs []Record) error {
	msgs := make([]*nats.Msg, 0, 2*len(recs))
	for _, r := range recs {
		lease, err := f.leaseMsg(r, 0)
		if err != nil {
			return err
		}
		msgs = append(msgs,
			&nats.Msg{Subject: kvSubject(r.key), Data: r.val, Header: nats.Header{"Nats-TTL": []string{"never"}}},
			lease)
	}
	seqs, err := f.publish(ctx, msgs)
	if err != nil {
		return err
	}
	for i := 1; i < len(msgs); i += 2 {
		f.setLeaseRevision(msgs[i].Subject, seqs[i])
	}
	return nil
}

// leaseMsg is the message that writes r's lease as a publisher does:
// Registry.RefreshLease's, a compare-and-set on rev, or with rev 0
// Registry.PutLease's.
func (f *Fleet) leaseMsg(r Record, rev uint64) (*nats.Msg, error) {
	var expect *uint64
	if rev != 0 {
		expect = &rev
	}
	return f.reg.LeaseMessage(r.service, r.id, string(leaseValue), expect)
}

// leaseRevision is the last acknowledged revision of the lease on subject
// (written by Put or a heartbeat), 0 if unknown (a record put by
// Heartbeats.Replace: its first renewal is then a put).
func (f *Fleet) leaseRevision(subject string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leaseRevs[subject]
}

// setLeaseRevision records the revision a lease write was acknowledged at.
func (f *Fleet) setLeaseRevision(subject string, rev uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leaseRevs[subject] = rev
}

// ScheduledLeases reports whether the fleet's leases carry their expiry
// signal (the bucket allows message schedules).
func (f *Fleet) ScheduledLeases() bool { return f.reg.ScheduledLeases() }

// RenewLeases renews the leases of recs once, as their publishers'
// renewals do (Registry.PutLease's message).
func (f *Fleet) RenewLeases(ctx context.Context, recs []Record) error {
	msgs := make([]*nats.Msg, len(recs))
	for i, r := range recs {
		m, err := f.leaseMsg(r, 0)
		if err != nil {
			return err
		}
		msgs[i] = m
	}
	_, err := f.publish(ctx, msgs)
	return err
}

// RefreshRecords puts recs again, unchanged and without the never-expire
// mark, as a publisher of protocol version 1 (whose record carries its own
// lease) refreshes.
func (f *Fleet) RefreshRecords(ctx context.Context, recs []Record) error {
	msgs := make([]*nats.Msg, len(recs))
	for i, r := range recs {
		msgs[i] = &nats.Msg{Subject: kvSubject(r.key), Data: r.val}
	}
	_, err := f.publish(ctx, msgs)
	return err
}

// leaseSuffix ends a lease's key (serverlist.LeaseKey); leaseValue is the
// fleet's lease value (a publisher writes its owner token).
const leaseSuffix = ".lease"

var leaseValue = []byte("scale-fleet")

// publish sends msgs to the bucket's stream, putWindow at a time, waits
// for their acknowledgements, and returns the sequence each was stored at.
func (f *Fleet) publish(ctx context.Context, msgs []*nats.Msg) ([]uint64, error) {
	seqs := make([]uint64, 0, len(msgs))
	for start := 0; start < len(msgs); start += putWindow {
		end := min(start+putWindow, len(msgs))
		futures := make([]jetstream.PubAckFuture, 0, end-start)
		for _, m := range msgs[start:end] {
			fut, err := f.js.PublishMsgAsync(m)
			if err != nil {
				return nil, err
			}
			futures = append(futures, fut)
		}
		for _, fut := range futures {
			select {
			case ack := <-fut.Ok():
				seqs = append(seqs, ack.Sequence)
			case err := <-fut.Err():
				return nil, err
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	return seqs, nil
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
	// those handed to the client, Skipped those of records taken out (see
	// Replace), Acked those the server acknowledged, Failed those it
	// refused or did not acknowledge in time.
	Due, Sent, Skipped, Acked, Failed int
	// Stalls counts the times the in-flight bound, or a lease whose last
	// put was not acknowledged yet, held the generator back (the server
	// acknowledged too slowly); MaxBehind is the most puts it
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
	return s.Due > 0 && 100*(s.Sent+s.Skipped) >= 99*s.Due && 100*s.Acked >= 99*s.Sent
}

// heartbeatTick is the interval at which Heartbeats catches up with its
// schedule.
const heartbeatTick = 5 * time.Millisecond

// Heartbeats renews a fleet's leases, as its publishers do: every record's
// lease once per period, spread evenly, each renewal a compare-and-set on
// the lease's last revision (Registry.RefreshLease's message, built by the
// registry itself), the revision taken from the previous write's
// acknowledgement. Build it with NewHeartbeats, run it with Run; Replace
// changes a record while it runs (a churn wave's new instances refresh,
// the replaced ones stop).
type Heartbeats struct {
	nc            *nats.Conn
	js            jetstream.JetStream
	fleet         *Fleet
	period        time.Duration
	acked, failed atomic.Int64
	mu            sync.Mutex // guards recs and subjects against Replace
	recs          []Record
	subjects      []string
	// pending holds the lease subjects whose put awaits its
	// acknowledgement: a lease's next put waits for it, as an announcer's
	// next renewal does, since it names the revision the last one made (a
	// compare-and-set that two puts in flight would fail).
	pendingMu sync.Mutex
	pending   map[string]bool
}

// NewHeartbeats returns heartbeats of recs (a copy is kept), leases of f,
// every period on nc, with at most maxInFlight puts awaiting their
// acknowledgement (the generator waits beyond).
func NewHeartbeats(nc *nats.Conn, f *Fleet, recs []Record, period time.Duration, maxInFlight int) (*Heartbeats, error) {
	if len(recs) == 0 || period <= 0 || maxInFlight < 1 {
		return nil, fmt.Errorf("scale: heartbeats of %d records every %v, %d in flight", len(recs), period, maxInFlight)
	}
	h := &Heartbeats{nc: nc, fleet: f, period: period, recs: slices.Clone(recs), subjects: make([]string, len(recs)), pending: map[string]bool{}}
	for i, r := range recs {
		h.subjects[i] = kvSubject(r.key + leaseSuffix)
	}
	var err error
	h.js, err = jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(maxInFlight),
		jetstream.WithPublishAsyncTimeout(ackWait),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
			f.setLeaseRevision(m.Subject, ack.Sequence)
			h.acked.Add(1)
			h.settled(m.Subject)
		}),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, _ error) {
			h.failed.Add(1)
			h.settled(m.Subject)
		}))
	if err != nil {
		return nil, err
	}
	return h, nil
}

// Replace makes recs[i] the record refreshed in place of record idx[i]; a
// nil recs stops refreshing those records. Once it returns, no put of a
// replaced record is sent any more and those sent before have reached the
// server (a flush of the connection): a purge sent after cannot be undone
// by a late refresh, as an announcer stops its lease loop before it
// deregisters.
func (h *Heartbeats) Replace(ctx context.Context, idx []int, recs []Record) error {
	h.mu.Lock()
	for i, k := range idx {
		if recs == nil {
			h.recs[k], h.subjects[k] = Record{}, ""
			continue
		}
		h.recs[k], h.subjects[k] = recs[i], kvSubject(recs[i].key+leaseSuffix)
	}
	h.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ackWait)
		defer cancel()
	}
	return h.nc.FlushWithContext(ctx)
}

// Run sends the heartbeats until ctx ends. It paces itself by the clock,
// not by counting ticks, so a slow tick is made up at the next one. It
// returns when ctx has ended and every put was acknowledged or failed (at
// most 2 x ackWait later).
func (h *Heartbeats) Run(ctx context.Context) (HeartbeatStats, error) {
	var st HeartbeatStats
	t := time.NewTicker(heartbeatTick)
	defer t.Stop()
	start := time.Now()
	next := 0
	due := func(elapsed time.Duration) int { return int(int64(elapsed) * int64(len(h.recs)) / int64(h.period)) }
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-t.C:
		}
		st.Due = due(time.Since(start))
		st.MaxBehind = max(st.MaxBehind, st.Due-st.Sent-st.Skipped)
		if err := h.send(ctx, &st, &next); err != nil {
			return st, err
		}
	}
	st.Elapsed = time.Since(start)
	st.Due = due(st.Elapsed)
	select {
	case <-h.js.PublishAsyncComplete():
	case <-time.After(2 * ackWait):
	}
	st.Acked, st.Failed = int(h.acked.Load()), int(h.failed.Load())
	return st, nil
}

// send catches up with the schedule (st.Due), from record next on.
func (h *Heartbeats) send(ctx context.Context, st *HeartbeatStats, next *int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for st.Sent+st.Skipped < st.Due && ctx.Err() == nil {
		if h.subjects[*next] == "" {
			st.Skipped++
			*next = (*next + 1) % len(h.recs)
			continue
		}
		subject := h.subjects[*next]
		if !h.begin(subject) {
			st.Stalls++
			return nil // its last put awaits its acknowledgement: go on at the next tick
		}
		m, err := h.fleet.leaseMsg(h.recs[*next], h.fleet.leaseRevision(subject))
		if err != nil {
			h.settled(subject)
			return err
		}
		_, err = h.js.PublishMsgAsync(m, jetstream.WithStallWait(heartbeatTick))
		if err != nil {
			h.settled(subject)
		}
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			st.Stalls++
			return nil // acknowledgements are late: go on at the next tick
		}
		if err != nil {
			return err
		}
		st.Sent++
		*next = (*next + 1) % len(h.recs)
	}
	return nil
}

// begin marks subject's put in flight; false when one already is.
func (h *Heartbeats) begin(subject string) bool {
	h.pendingMu.Lock()
	defer h.pendingMu.Unlock()
	if h.pending[subject] {
		return false
	}
	h.pending[subject] = true
	return true
}

// settled marks subject's put acknowledged or failed.
func (h *Heartbeats) settled(subject string) {
	h.pendingMu.Lock()
	defer h.pendingMu.Unlock()
	delete(h.pending, subject)
}

// ackWait bounds the wait for one heartbeat's acknowledgement.
const ackWait = 5 * time.Second
