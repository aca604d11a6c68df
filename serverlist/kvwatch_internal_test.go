package serverlist

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// openWatchRegistry opens a registry on a server of its own.
func openWatchRegistry(t *testing.T) *Registry {
	t.Helper()
	js, err := jetstream.New(natstest.Start(t).Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	r, err := Open(ctx, js, RegistryConfig{Bucket: "watch"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// seen is what a watch reports of an entry (nil: the catch-up marker).
type seen struct {
	key   string
	value string
	rev   uint64
	op    jetstream.KeyValueOp
	delta uint64
}

func (s seen) String() string {
	return fmt.Sprintf("%s=%q@%d op %v delta %d", s.key, s.value, s.rev, s.op, s.delta)
}

// take reads n entries of w (a marker as key "<marker>").
func take(t *testing.T, w jetstream.KeyWatcher, n int) []seen {
	t.Helper()
	var out []seen
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for len(out) < n {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				t.Fatalf("the watch closed after %d of %d entries: %v", len(out), n, out)
			}
			if e == nil {
				out = append(out, seen{key: "<marker>"})
				continue
			}
			out = append(out, seen{key: e.Key(), value: string(e.Value()), rev: e.Revision(), op: e.Operation(), delta: e.Delta()})
		case <-timeout.C:
			t.Fatalf("%d of %d entries after 30 s: %v", len(out), n, out)
		}
	}
	return out
}

// TestBoundedWatchDeliversAsKeyValueWatch: the bounded watch and
// jetstream's KeyValue.Watch of the same filter report the same entries
// (key, value, revision, operation, pending count) and the catch-up
// marker at the same place, for the initial values (puts, a deleted and a
// purged key, another filter's key left out) and for live changes.
func TestBoundedWatchDeliversAsKeyValueWatch(t *testing.T) {
	r := openWatchRegistry(t)
	ctx := t.Context()
	for i := range 20 {
		if _, err := r.kv.Put(ctx, fmt.Sprintf("svc-%d.i%d", i%3, i), []byte(fmt.Sprintf("v%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.kv.Delete(ctx, "svc-1.i1"); err != nil {
		t.Fatal(err)
	}
	if err := r.kv.Purge(ctx, "svc-2.i2"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.kv.Put(ctx, "svc-0.i0.lease", []byte("x")); err != nil { // not a record
		t.Fatal(err)
	}
	want, err := r.kv.Watch(ctx, RecordKeys)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Stop()
	got, err := r.watchBounded(ctx, RecordKeys)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Stop()

	compare := func(n int) {
		t.Helper()
		w, g := take(t, want, n), take(t, got, n)
		for i := range w {
			if w[i] != g[i] {
				t.Fatalf("entry %d: bounded watch %v, KeyValue.Watch %v\nbounded: %v\nwatch:   %v", i, g[i], w[i], g, w)
			}
		}
	}
	compare(21) // 20 keys and the marker
	if _, err := r.kv.Put(ctx, "svc-0.i21", []byte("new")); err != nil {
		t.Fatal(err)
	}
	if err := r.kv.Delete(ctx, "svc-0.i3"); err != nil {
		t.Fatal(err)
	}
	if err := r.kv.Purge(ctx, "svc-0.i6"); err != nil {
		t.Fatal(err)
	}
	compare(3)
}

// TestBoundedWatchOfAnEmptyBucket: the marker comes first, then changes.
func TestBoundedWatchOfAnEmptyBucket(t *testing.T) {
	r := openWatchRegistry(t)
	w, err := r.watchBounded(t.Context(), RecordKeys)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if got := take(t, w, 1); got[0].key != "<marker>" {
		t.Fatalf("first entry of an empty bucket's watch: %v, want the marker", got[0])
	}
	rev, err := r.kv.Put(t.Context(), "svc.a", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	if got := take(t, w, 1); got[0] != (seen{key: "svc.a", value: "v", rev: rev}) {
		t.Fatalf("got %v after a put at %d", got[0], rev)
	}
}

// TestBoundedWatchHoldsLittleInFlight: while nobody reads a watch of 5,000
// records, the server has delivered to the client at most what the pull
// consumer's buffer and the updates channel hold, where KeyValue.Watch's
// push consumer lets the server send them all (its flow-control window is
// 2 MiB at first, and grows to 32 MiB). Every entry still arrives once
// read, the marker after the last.
func TestBoundedWatchHoldsLittleInFlight(t *testing.T) {
	const records = 5000
	r := openWatchRegistry(t)
	ctx := t.Context()
	value := make([]byte, 200)
	for i := range records {
		if _, err := r.kv.Put(ctx, fmt.Sprintf("svc-%d.i%d", i%50, i), value); err != nil {
			t.Fatal(err)
		}
	}
	w, err := r.watchBounded(ctx, RecordKeys)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// The channel fills: the watch's goroutine then holds one more entry
	// and waits, and the pull consumer's buffer fills behind it.
	testutil.EventuallyWithin(t, 30*time.Second, "the updates channel to fill", func() bool {
		return len(w.Updates()) == watchUpdates
	})
	stream, err := r.js.Stream(ctx, "KV_"+r.cfg.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	bound := uint64(watchUpdates + 1 + watchBuffer)
	for c := range stream.ListConsumers(ctx).Info() {
		if c.Delivered.Consumer > bound {
			t.Fatalf("the server delivered %d of %d records to a watch nobody reads, want at most %d", c.Delivered.Consumer, records, bound)
		}
	}
	got := take(t, w, records+1)
	for i, e := range got[:records] {
		if e.key == "<marker>" {
			t.Fatalf("the marker came at entry %d of %d", i, records)
		}
	}
	if got[records].key != "<marker>" {
		t.Fatalf("entry %d is %v, want the marker", records, got[records])
	}
}

// TestBoundedWatchStops: Stop returns without a reader, closes the channel
// and deletes the watch's consumer; so does the end of the watch's
// context.
func TestBoundedWatchStops(t *testing.T) {
	r := openWatchRegistry(t)
	for i := range 600 { // more than the channel holds
		if _, err := r.kv.Put(t.Context(), fmt.Sprintf("svc.i%d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	w, err := r.watchBounded(t.Context(), RecordKeys)
	if err != nil {
		t.Fatal(err)
	}
	testutil.EventuallyWithin(t, 30*time.Second, "the updates channel to fill", func() bool {
		return len(w.Updates()) == watchUpdates
	})
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	_ = w.Stop() // again
	closed(t, w)
	if n := consumers(t, r); n != 0 {
		t.Fatalf("%d consumers left on the bucket's stream after the watch's Stop returned", n)
	}

	ctx, cancel := context.WithCancel(t.Context())
	w, err = r.watchBounded(ctx, RecordKeys)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	closed(t, w)
	_ = w.Stop()
	testutil.EventuallyWithin(t, 10*time.Second, "the consumer of a watch whose context ended to be deleted", func() bool {
		return consumers(t, r) == 0
	})
}

// consumers counts the consumers of r's bucket.
func consumers(t *testing.T, r *Registry) int {
	t.Helper()
	stream, err := r.js.Stream(t.Context(), "KV_"+r.cfg.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range stream.ListConsumers(t.Context()).Info() {
		n++
	}
	return n
}

// closed drains w and fails unless its channel is closed within
// watchDrainTimeout.
func closed(t *testing.T, w jetstream.KeyWatcher) {
	t.Helper()
	if !drain(w) {
		t.Fatalf("the watch's channel is still open %v after its stop", watchDrainTimeout)
	}
}
