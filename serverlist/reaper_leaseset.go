package serverlist

import (
	"context"
	"hash/maphash"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/events"
)

// listLeases returns the live lease keys of the lease subjects filters
// match, read from the last message of each (headers only, through an
// ordered push consumer, as a KV watch reads: the reaper's permissions are
// a watcher's), and how many of them carry no expiry signal.
func (r *Reaper) listLeases(ctx context.Context, filters []string) (leaseSet, int, error) {
	live := newLeaseSet()
	plain, err := r.listLeasesInto(ctx, live, filters)
	if err != nil {
		return leaseSet{}, 0, err
	}
	return live, plain, nil
}

// listLeasesInto is listLeases adding the keys to live.
func (r *Reaper) listLeasesInto(ctx context.Context, live leaseSet, filters []string) (int, error) {
	js, err := r.reg.js.Conn().JetStream()
	if err != nil {
		return 0, err
	}
	prefix := r.reg.subject("")
	var (
		mu                sync.Mutex // guards what the handler writes
		plain             int
		received, pending uint64
		done              = make(chan struct{})
		finished          bool
	)
	finish := func() { // with mu held
		if !finished {
			finished = true
			close(done)
		}
	}
	subject, opts := filters[0], []nats.SubOpt{nats.BindStream("KV_" + r.reg.cfg.Bucket), nats.OrderedConsumer(), nats.DeliverLastPerSubject(), nats.HeadersOnly(), nats.Context(ctx)}
	if len(filters) > 1 {
		subject, opts = "", append(opts, nats.ConsumerFilterSubjects(filters...))
	}
	mu.Lock()
	sub, err := js.Subscribe(subject, func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		md, err := m.Metadata()
		if finished || err != nil {
			return
		}
		if !isRemoval(m.Header) {
			live.add(m.Subject[len(prefix):])
			if m.Header.Get(headerSchedule) == "" {
				plain++
			}
		}
		if received++; received >= pending || md.NumPending == 0 {
			finish()
		}
	}, opts...)
	if err != nil {
		mu.Unlock()
		return 0, err
	}
	defer sub.Unsubscribe()
	pending, err = sub.InitialConsumerPending()
	if err != nil || pending == 0 {
		finish()
	}
	mu.Unlock()
	if err != nil {
		return 0, err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	return plain, nil
}

// leaseSet is the set of live lease keys a sweep lists, held as keyed
// 64-bit hashes instead of the key strings (each a slice of its message's
// subject, which it kept alive): a sweep without a mirror holds every
// lease in one (some 2 MB at 100,000 instead of about 12 MB of strings), a
// mirrored sweep one batch's (sweepBatchLeases). A collision (odds about
// n²/2^65: 3 x 10^-10 at 100,000 keys) makes an orphan record look leased
// for one sweep: the next sweep's set has a seed of its own.
type leaseSet struct {
	seed maphash.Seed
	sums map[uint64]struct{}
}

func newLeaseSet() leaseSet { return newLeaseSetFor(0) }

// newLeaseSetFor returns a set sized for n keys: a mirrored sweep's batch
// knows about how many leases it lists, and its set does not grow.
func newLeaseSetFor(n int) leaseSet {
	return leaseSet{seed: maphash.MakeSeed(), sums: make(map[uint64]struct{}, n)}
}

// add adds the lease key key.
func (s leaseSet) add(key string) { s.sums[maphash.String(s.seed, key)] = struct{}{} }

// holdsLeaseOf reports whether the set holds the lease key of the record
// key record (record + leaseSuffix), without building that string.
func (s leaseSet) holdsLeaseOf(record string) bool {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(record)
	h.WriteString(leaseSuffix)
	_, ok := s.sums[h.Sum64()]
	return ok
}

// holdsLeaseOfInstance is holdsLeaseOf for the record of service/id,
// without building its key: the ID is encoded on the stack.
func (s leaseSet) holdsLeaseOfInstance(service, id string) bool {
	var raw [events.MaxInstanceIDLength]byte
	var enc [maxEncodedID]byte
	n := copy(raw[:], id)
	keyEncoding.Encode(enc[:], raw[:n])
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(service)
	h.WriteByte('.')
	h.Write(enc[:keyEncoding.EncodedLen(n)])
	h.WriteString(leaseSuffix)
	_, ok := s.sums[h.Sum64()]
	return ok
}
