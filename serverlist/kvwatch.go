package serverlist

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// watchBuffer is how many of a bounded watch's messages the client holds
// before the mirror takes them: the pull consumer's buffer. With the
// updates channel's watchUpdates entries it bounds what a watch of the
// whole registry holds in flight to some 1.5 MB. A smaller buffer (512)
// made the start of 100,000 records slower: the pull requests' round trips
// showed.
const (
	watchBuffer  = 2048
	watchUpdates = 256
)

// boundedWatch is a watch of the registry's keys that match a filter,
// delivered as jetstream's KeyValue.Watch delivers it: the last entry of
// each key, a nil entry once those are all delivered (the catch-up
// marker), then every change, in revision order. It reads through a pull
// consumer of its own that holds at most watchBuffer messages, where
// KeyValue.Watch's push consumer lets the server send ahead up to its
// flow-control window (32 MiB): a mirror of 100,000 records that applies
// them more slowly than the server sends held some 20 MB of queued
// messages at its start, which the collector's pacer doubles in resident
// memory (docs/perf/memory.md).
//
// Its goroutine delivers on a channel of watchUpdates entries and blocks
// while it is full; Stop ends it without a reader. The channel is closed
// when the watch ends: Stop, its context's end, or a consumer that cannot
// go on (a gap in its sequence, its heartbeats missed, an error): the
// caller then resyncs, as after a reconnect. Not an ordered consumer,
// which recreates itself on such faults: one stopped while it recreated
// itself (a server cut) went on with the new consumer, never stopped,
// and its reader waited for it for ever.
type boundedWatch struct {
	updates chan jetstream.KeyValueEntry
	js      jetstream.JetStream
	cons    jetstream.Consumer
	it      jetstream.MessagesContext
	quit    chan struct{}
	once    sync.Once
	done    chan struct{}
	unhook  func() bool
}

// watchBounded starts a boundedWatch of the keys matching filter (the
// key's pattern, as KeyValue.Watch takes it).
func (r *Registry) watchBounded(ctx context.Context, filter string) (jetstream.KeyWatcher, error) {
	return watchBucket(ctx, r.js, r.cfg.Bucket, filter)
}

// watchBucket starts a boundedWatch of the keys of bucket, in js (this
// connection's JetStream, or another region's through its domain), that
// match filter.
func watchBucket(ctx context.Context, js jetstream.JetStream, bucket, filter string) (jetstream.KeyWatcher, error) {
	prefix := "$KV." + bucket + "."
	cons, err := js.CreateConsumer(ctx, "KV_"+bucket, jetstream.ConsumerConfig{
		FilterSubject:     prefix + filter,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: watchInactive,
	})
	if err != nil {
		return nil, fmt.Errorf("serverlist: watch %s in %s: %w", filter, bucket, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(watchBuffer))
	if err != nil {
		return nil, fmt.Errorf("serverlist: watch %s in %s: %w", filter, bucket, err)
	}
	// The pending count when the consumer was created: the entries
	// before the catch-up marker.
	var initial uint64
	if info := cons.CachedInfo(); info != nil {
		initial = info.NumPending
	}
	w := &boundedWatch{
		updates: make(chan jetstream.KeyValueEntry, watchUpdates),
		js:      js,
		cons:    cons,
		it:      it,
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	w.unhook = context.AfterFunc(ctx, func() { _ = w.Stop() })
	go w.run(prefix, bucket, initial)
	return w, nil
}

// Updates returns the watch's entries; see boundedWatch.
func (w *boundedWatch) Updates() <-chan jetstream.KeyValueEntry { return w.updates }

// Stop ends the watch and waits for its goroutine: the updates channel is
// closed when it returns. The first call then deletes the watch's consumer,
// as KeyValue.Watch's Stop does, waiting for the server's answer up to
// watchDeleteTimeout (the client's own would leave it to the server's
// inactivity threshold, 5 minutes). Safe to call more than once and
// concurrently.
func (w *boundedWatch) Stop() error {
	w.once.Do(func() {
		close(w.quit)
		w.it.Stop()
		<-w.done
		if info := w.cons.CachedInfo(); info != nil {
			ctx, cancel := context.WithTimeout(context.Background(), watchDeleteTimeout)
			_ = w.js.DeleteConsumer(ctx, info.Stream, info.Name)
			cancel()
		}
	})
	<-w.done
	return nil
}

// watchDeleteTimeout bounds the wait for the deletion of a stopped
// watch's consumer: the client's request timeout. watchInactive is how
// long the server keeps a consumer whose client went away without
// deleting it (a crash, a cut).
const (
	watchDeleteTimeout = 5 * time.Second
	watchInactive      = 5 * time.Minute
)

func (w *boundedWatch) run(prefix, bucket string, initial uint64) {
	defer close(w.done)
	defer close(w.updates)
	defer w.unhook()
	synced := initial == 0
	if synced && !w.send(nil) {
		return
	}
	var received, delivered uint64
	for {
		msg, err := w.it.Next()
		if err != nil {
			// ErrMsgIteratorClosed after Stop; anything else ends the
			// watch too, and the caller resyncs.
			return
		}
		md, err := msg.Metadata()
		if err != nil || md.Sequence.Consumer != delivered+1 {
			return // a gap: the caller resyncs
		}
		delivered = md.Sequence.Consumer
		e, ok := kvEntryOf(msg, md, prefix, bucket)
		if !ok {
			continue
		}
		if !w.send(e) {
			return
		}
		if !synced {
			if received++; received >= initial || e.delta == 0 {
				synced = true
				if !w.send(nil) {
					return
				}
			}
		}
	}
}

// send delivers e (nil: the catch-up marker) unless the watch stops.
func (w *boundedWatch) send(e jetstream.KeyValueEntry) bool {
	select {
	case w.updates <- e:
		return true
	case <-w.quit:
		return false
	}
}

// kvEntry is one entry of a boundedWatch: what jetstream.KeyValueEntry
// reports, read from the message as KeyValue.Watch reads it.
type kvEntry struct {
	bucket, key string
	value       []byte
	revision    uint64
	created     time.Time
	delta       uint64
	op          jetstream.KeyValueOp
}

func (e *kvEntry) Bucket() string                  { return e.bucket }
func (e *kvEntry) Key() string                     { return e.key }
func (e *kvEntry) Value() []byte                   { return e.value }
func (e *kvEntry) Revision() uint64                { return e.revision }
func (e *kvEntry) Created() time.Time              { return e.created }
func (e *kvEntry) Delta() uint64                   { return e.delta }
func (e *kvEntry) Operation() jetstream.KeyValueOp { return e.op }

// kvEntryOf reads a watch's message as KeyValue.Watch reads it: its key
// (the subject past prefix), value, revision (the stream sequence), time
// and pending count (its JetStream metadata), and operation (the
// KV-Operation header, or a marker's reason: a TTL's marker is a purge, a
// removal's a delete). ok is false for a message that is not a key's.
func kvEntryOf(msg jetstream.Msg, md *jetstream.MsgMetadata, prefix, bucket string) (e *kvEntry, ok bool) {
	subject := msg.Subject()
	if len(subject) <= len(prefix) || !strings.HasPrefix(subject, prefix) {
		return nil, false
	}
	e = &kvEntry{bucket: bucket, key: subject[len(prefix):], value: msg.Data(), revision: md.Sequence.Stream, created: md.Timestamp, delta: md.NumPending}
	if h := msg.Headers(); len(h) > 0 {
		e.op = kvOperation(h)
	}
	return e, true
}

// kvOperation is the KV operation a message's headers state, as
// jetstream's KeyValue.Watch reads them.
func kvOperation(h nats.Header) jetstream.KeyValueOp {
	if op := h.Get("KV-Operation"); op != "" {
		switch op {
		case "DEL":
			return jetstream.KeyValueDelete
		case "PURGE":
			return jetstream.KeyValuePurge
		}
		return jetstream.KeyValuePut
	}
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge":
		return jetstream.KeyValuePurge
	case "Remove":
		return jetstream.KeyValueDelete
	}
	return jetstream.KeyValuePut
}
