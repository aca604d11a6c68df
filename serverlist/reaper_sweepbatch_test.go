package serverlist

import (
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
)

// TestReaperSweepBatches: a mirrored sweep lists the leases of a batch of
// services at a time into a set of the batch's own, checks the batch's
// records against it and lets it go. The services are grouped in order
// while a batch holds at most sweepBatchLeases records, a larger service
// alone, and a service whose only record the mirror leaves out (marked
// down) has a batch too. Two sweeps remove exactly the records without a
// lease: indexed ones, one marked down, a malformed one and one whose key
// has no valid service; the records with a lease, one of them marked
// down, stay.
func TestReaperSweepBatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	// The leases outlive the test: no holder renews them.
	reg, err := Open(ctx, js, RegistryConfig{TTL: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	// The services and their records, indexed or left out by the mirror.
	// In order: a and b fill a batch (225 records), c would take it past
	// 250 and d (375) is a batch alone; e, f (a record marked down
	// alone) and g share the last.
	sizes := map[string]int{"svc-a": 100, "svc-b": 125, "svc-c": 75, "svc-d": 375, "svc-e": 50, "svc-g": 75}
	want := [][]string{{"svc-a", "svc-b"}, {"svc-c"}, {"svc-d"}, {"svc-e", "svc-f", "svc-g"}}
	unleased := map[string]struct{}{} // record keys without a lease
	records := map[string]int{}       // service: its records
	leases := map[string]int{}        // service: its leases
	var msgs []*nats.Msg
	write := func(service, id string, in *Instance, raw []byte, leased bool) {
		key, err := EncodeKey(service, id)
		if err != nil {
			t.Fatal(err)
		}
		if in != nil {
			if key, raw, err = encodeInstance(*in); err != nil {
				t.Fatal(err)
			}
		}
		m := nats.NewMsg(reg.subject(key))
		m.Data = raw
		m.Header.Set(headerTTL, "never") // as Claim writes records
		msgs = append(msgs, m)
		records[service]++
		if !leased {
			unleased[key] = struct{}{}
			return
		}
		lease, err := reg.LeaseMessage(service, id, "o", nil)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, lease)
		leases[service]++
	}
	instance := func(service, id string, down bool) *Instance {
		in := &Instance{Service: service, InstanceID: id, Host: "127.0.0.1", Port: 8000, Zone: "a", Incarnation: 1, Owner: "o"}
		if down {
			in.Status = StatusDown
		}
		return in
	}
	for _, service := range slices.Sorted(maps.Keys(sizes)) {
		for i := range sizes[service] {
			id := fmt.Sprintf("i%04d", i)
			leased := !(i%500 == 7 || service == "svc-g" && i == 0)
			write(service, id, instance(service, id, service == "svc-e" && i == 1), nil, leased)
		}
	}
	write("svc-b", "junk", nil, []byte("{not a record"), false)
	write("svc-f", "down", instance("svc-f", "down", true), nil, false)
	// A key without a valid service: no batch lists its lease.
	bad := nats.NewMsg(reg.subject("bad=svc.x"))
	bad.Data = []byte("{}")
	bad.Header.Set(headerTTL, "never")
	msgs = append(msgs, bad)
	unleased["bad=svc.x"] = struct{}{}
	for chunk := range slices.Chunk(msgs, 500) {
		var acks []jetstream.PubAckFuture
		for _, m := range chunk {
			ack, err := js.PublishMsgAsync(m)
			if err != nil {
				t.Fatal(err)
			}
			acks = append(acks, ack)
		}
		for _, ack := range acks {
			select {
			case <-ack.Ok():
			case err := <-ack.Err():
				t.Fatalf("write %s: %v", ack.Msg().Subject, err)
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
	}

	m := NewMirror(reg, MirrorConfig{})
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close the mirror: %v", err)
		}
	})
	if err := m.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(m.skippedKeys()); got != 4 {
		t.Fatalf("the mirror leaves out %d records (%v), want 4: two marked down, a malformed one and a bad key", got, m.skippedKeys())
	}
	if _, ok := m.state.Load().services["svc-f"]; ok {
		t.Fatal("the mirror indexes a service whose only record is marked down")
	}

	type batch struct {
		services []string
		leases   int
		seed     maphash.Seed
		held     map[string]bool // service: the set holds its first record's lease
	}
	var batches []batch
	testHookSweepBatch = func(services []string, live leaseSet) {
		b := batch{services: slices.Clone(services), leases: len(live.sums), seed: live.seed, held: map[string]bool{}}
		for _, service := range slices.Sorted(maps.Keys(records)) {
			key, _ := EncodeKey(service, "i0001")
			b.held[service] = live.holdsLeaseOf(key)
		}
		batches = append(batches, b)
	}
	t.Cleanup(func() { testHookSweepBatch = nil })

	r := NewReaper(reg, ReaperConfig{Node: "r", Mirror: m})
	next, plain := r.sweep(ctx, nil)
	if !slices.EqualFunc(batches, want, func(b batch, w []string) bool { return slices.Equal(b.services, w) }) {
		t.Fatalf("batches %v, want %v", batches, want)
	}
	seeds := map[maphash.Seed]bool{}
	for _, b := range batches {
		n, wantLeases := 0, 0
		for _, service := range b.services {
			n += records[service]
			wantLeases += leases[service]
		}
		if n > sweepBatchLeases && len(b.services) > 1 {
			t.Errorf("batch %v holds %d records, over %d", b.services, n, sweepBatchLeases)
		}
		// The set holds the batch's leases, none of another batch.
		if b.leases != wantLeases {
			t.Errorf("batch %v: a set of %d leases, want its own %d", b.services, b.leases, wantLeases)
		}
		for service, held := range b.held {
			if in := slices.Contains(b.services, service) && leases[service] > 0; held != in {
				t.Errorf("batch %v: the set holds the lease of %s: %v", b.services, service, held)
			}
		}
		if seeds[b.seed] {
			t.Errorf("batch %v shares a set with a batch before", b.services)
		}
		seeds[b.seed] = true
	}
	wantPlain := 0
	if !reg.scheduledLeases.Load() {
		for _, n := range leases {
			wantPlain += n
		}
	}
	if plain != wantPlain {
		t.Errorf("plain leases %d, want %d", plain, wantPlain)
	}
	if got, want := slices.Sorted(maps.Keys(next)), slices.Sorted(maps.Keys(unleased)); !slices.Equal(got, want) {
		t.Fatalf("the first sweep found without a lease %v, want %v", got, want)
	}
	if st := r.Stats(); st.Reaped != 0 || st.MirroredSweeps != 1 {
		t.Fatalf("after the first sweep: %+v, want one mirrored sweep and nothing reaped", st)
	}

	batches = nil
	if next, _ = r.sweep(ctx, next); len(next) != 0 {
		t.Fatalf("the second sweep left %v without a lease", next)
	}
	if len(batches) != len(want) {
		t.Fatalf("the second sweep's batches %v, want %v", batches, want)
	}
	if st := r.Stats(); st.Reaped != uint64(len(unleased)) || st.MirroredSweeps != 2 || st.Errors != 0 {
		t.Fatalf("after the second sweep: %+v, want %d reaped by two mirrored sweeps, no error", st, len(unleased))
	}
	lister, err := reg.kv.ListKeysFiltered(ctx, RecordKeys)
	if err != nil {
		t.Fatal(err)
	}
	left := 0
	for key := range lister.Keys() {
		if _, ok := unleased[key]; ok {
			t.Errorf("record %s without a lease is still there", key)
		}
		left++
	}
	total := 0
	for _, n := range records {
		total += n
	}
	if want := total + 1 - len(unleased); left != want {
		t.Fatalf("%d records left, want the %d with a lease", left, want)
	}
}
