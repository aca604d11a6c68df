package serverlist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
)

const (
	// DefaultTTL is the default lease: an entry not refreshed for this long
	// expires. Publishers refresh well within it (a third is a good
	// interval).
	DefaultTTL = 30 * time.Second
	// MinTTL is the shortest lease. JetStream keeps expiry markers for whole
	// seconds and rejects a marker TTL under one second.
	MinTTL = time.Second
	// bucketPrefix starts every derived bucket name.
	bucketPrefix = "pushlb_"
	// watchDrainTimeout bounds how long stopping a watcher waits for the
	// client to close its channel.
	watchDrainTimeout = 2 * time.Second
)

// RegistryConfig configures [Open]. The zero value is usable: every zero
// field means its documented default.
type RegistryConfig struct {
	// Bucket names the JetStream KV bucket. Empty means BucketName(Prefix)
	// ("pushlb_lb" by default). A bucket name holds only [A-Za-z0-9_-].
	Bucket string

	// Prefix is the deployment's subject prefix (wire protocol section 4);
	// here it only derives the default bucket name. Empty means
	// events.DefaultPrefix ("lb").
	Prefix string

	// TTL is the lease, the bucket's MaxAge, used when [Open] creates the
	// bucket: an entry that is not refreshed ([Registry.Refresh]) within TTL
	// expires, and watchers see it go as a purge (see [Registry] on expiry).
	// An existing bucket keeps its own TTL, which is the one in effect
	// ([Registry.Config]); a non-zero TTL that disagrees is logged as a
	// warning. Zero means the bucket's, or DefaultTTL (30 s) when creating
	// it; a negative value or one under MinTTL (1 s) is invalid. There is
	// no "never expire": without leases a crashed instance would stay
	// registered forever.
	TTL time.Duration

	// RequireTTL makes a non-zero TTL that disagrees with an existing
	// bucket's an error of Open (wrapping ErrLeaseMismatch) instead of a
	// warning: for a program whose lease was set on purpose and would
	// otherwise be ignored without a word.
	RequireTTL bool

	// PlainLeases makes Open create a missing bucket without message
	// schedules, so that leases carry no expiry signal and the leading
	// reaper receives every renewal, which costs the NATS server less
	// (docs/protocol.md, "The reaper by design"): for a gateway that
	// embeds the NATS server. False allows schedules on a bucket Open
	// creates. An existing bucket is never changed either way. A reaper
	// over a registry opened with it says at info level that its leases
	// are plain, where it otherwise warns.
	PlainLeases bool

	// MarkerTTL is how long the marker left by an expiry stays in the bucket
	// (JetStream's LimitMarkerTTL), used when Open creates the bucket. Live watchers see the marker as soon as
	// it is written; the TTL only matters to watchers that start later. Zero
	// means TTL; otherwise at least 1 s.
	MarkerTTL time.Duration

	// Replicas is the number of JetStream replicas of the bucket, 1 to 5
	// (MaxReplicas), used when Open creates the bucket and as the target of
	// [Registry.ScaleUp]. Zero means min(DefaultReplicas (3), the JetStream
	// servers of the cluster), discovered by the server's placement (see
	// replicas.go): R1 on a lone server, R3 on a cluster of three or more.
	// An existing bucket keeps its own count ([Registry.Config] reports
	// it); a non-zero Replicas above it is logged as a warning.
	Replicas int

	// Storage is where JetStream keeps the bucket (when Open creates it). The zero value is
	// jetstream.FileStorage, which survives server restarts.
	Storage jetstream.StorageType

	// Logger receives reports of malformed entries. The zero value logs
	// nothing.
	Logger zerolog.Logger
}

// withDefaults fills the zero fields and validates the result.
func (c RegistryConfig) withDefaults() (RegistryConfig, error) {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Bucket == "" {
		c.Bucket = BucketName(c.Prefix)
	}
	if !validBucket(c.Bucket) {
		return c, fmt.Errorf("%w: bucket name %q: only [A-Za-z0-9_-] allowed", ErrInvalidConfig, c.Bucket)
	}
	switch {
	case c.TTL == 0:
		c.TTL = DefaultTTL
	case c.TTL < MinTTL:
		return c, fmt.Errorf("%w: TTL %v: at least %v", ErrInvalidConfig, c.TTL, MinTTL)
	}
	switch {
	case c.MarkerTTL == 0:
		c.MarkerTTL = c.TTL
	case c.MarkerTTL < time.Second:
		return c, fmt.Errorf("%w: MarkerTTL %v: at least 1s", ErrInvalidConfig, c.MarkerTTL)
	}
	if c.Replicas < 0 || c.Replicas > MaxReplicas {
		return c, fmt.Errorf("%w: Replicas %d: 1 to %d (0: automatic)", ErrInvalidConfig, c.Replicas, MaxReplicas)
	}
	return c, nil
}

// BucketName is the registry bucket of a deployment's subject prefix (wire
// protocol section 4): "pushlb_" followed by the prefix with every '.'
// replaced by '_', so prefix "lb" gives "pushlb_lb" and "prod.eu.lb"
// gives "pushlb_prod_eu_lb". Every process of a deployment derives the
// name this way.
func BucketName(prefix string) string {
	return bucketPrefix + strings.ReplaceAll(prefix, ".", "_")
}

// validBucket: a bucket name holds the same bytes as a NATS token
// ([A-Za-z0-9_-]), which events.ValidateService checks.
func validBucket(name string) bool { return events.ValidateService(name) == nil }

// Registry is the instance registry: one JetStream KV entry per instance,
// keyed by [EncodeKey], valued by the JSON of [Instance], with a lease (the
// bucket's MaxAge).
//
// # Expiry
//
// The bucket is created with limit markers (LimitMarkerTTL, nats-server
// 2.11+). When an entry outlives TTL, the server removes it and writes a
// marker in its place with the header "Nats-Marker-Reason: MaxAge"; KV
// watchers receive it as an entry with Operation() == jetstream.KeyValuePurge
// and an empty value, exactly as if the key had been purged. [Mirror] treats
// every delete or purge as "gone". Deregister purges the key too, so there is
// one way an instance disappears, whatever the cause.
//
// A Registry holds no background goroutine and is safe for concurrent use.
type Registry struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	cfg RegistryConfig
	log zerolog.Logger
	// wantReplicas is the configured replica count, 0 for automatic.
	wantReplicas int

	malformed atomic.Uint64
	// scheduledLeases: the bucket allows message schedules, so leases are
	// written in their scheduled form (lease_schedule.go).
	scheduledLeases atomic.Bool

	stream atomic.Pointer[jetstream.Stream] // the bucket's, for MayHold; fetched once
}

// Open returns a Registry over the bucket cfg names, creating the bucket
// (with cfg's TTL, MarkerTTL, Replicas and Storage) when it does not exist.
// An existing bucket is never changed: its configuration belongs to the
// deployment, not to whichever process starts last (a gateway may raise its
// replicas with [Registry.ScaleUp]). Its TTL is the lease in effect
// ([Registry.Config] reports it and its replicas); a cfg.TTL that disagrees
// is logged as a warning and ignored. It returns an error wrapping ErrInvalidConfig
// for a bad cfg and jetstream.ErrLimitMarkerTTLNotSupported on a server
// older than 2.11.
func Open(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig) (*Registry, error) {
	asked := cfg.TTL
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Registry{js: js, cfg: cfg, log: cfg.Logger, wantReplicas: cfg.Replicas}
	var kv jetstream.KeyValue
	err = retryUnanswered(ctx, func(ctx context.Context) (err error) {
		kv, err = js.KeyValue(ctx, cfg.Bucket)
		return err
	})
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		kv, err = r.create(ctx)
	case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		// Nobody answers the JetStream API: the server runs without it.
		err = fmt.Errorf("%w: open bucket %s: %w", ErrNoJetStream, cfg.Bucket, err)
	case err != nil:
		err = fmt.Errorf("serverlist: open bucket %s: %w", cfg.Bucket, err)
	}
	if err != nil {
		return nil, err
	}
	r.kv = kv
	if err := r.adopt(ctx, asked); err != nil {
		return nil, err
	}
	return r, nil
}

// create creates the bucket from the registry's configuration, with the
// configured replicas or the most the cluster places (replicas.go). A bucket
// created meanwhile by another process is opened instead.
func (r *Registry) create(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := r.createReplicated(ctx, jetstream.KeyValueConfig{
		Bucket:         r.cfg.Bucket,
		Description:    "pushlb instance registry",
		History:        1,
		TTL:            r.cfg.TTL,
		LimitMarkerTTL: r.cfg.MarkerTTL,
		MaxValueSize:   MaxValueSize,
		Storage:        r.cfg.Storage,
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = r.js.KeyValue(ctx, r.cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("serverlist: create bucket %s: %w", r.cfg.Bucket, err)
	}
	r.raiseConsumerLimitOnCreate(ctx)
	if !r.cfg.PlainLeases {
		r.allowSchedulesOnCreate(ctx)
	}
	return kv, nil
}

// adopt takes the lease from the bucket: its TTL and marker TTL are the ones
// in effect. asked is the TTL the caller configured (0: none).
func (r *Registry) adopt(ctx context.Context, asked time.Duration) error {
	var st jetstream.KeyValueStatus
	err := retryUnanswered(ctx, func(ctx context.Context) (err error) {
		st, err = r.kv.Status(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("serverlist: bucket %s status: %w", r.cfg.Bucket, err)
	}
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
		r.cfg.Replicas = max(bs.StreamInfo().Config.Replicas, 1)
		r.noteSchedules(bs.StreamInfo().Config)
		if r.wantReplicas > r.cfg.Replicas {
			r.log.Warn().Str("bucket", r.cfg.Bucket).Int("configured_replicas", r.wantReplicas).Int("bucket_replicas", r.cfg.Replicas).
				Msg("serverlist: the registry bucket has fewer replicas than configured; it is not changed here (a gateway scales it up at start)")
		}
	}
	ttl, marker := st.TTL(), st.LimitMarkerTTL()
	switch {
	case ttl <= 0:
		// A bucket without MaxAge never expires an entry: keep the
		// configured lease for the refresh pace, and say what it means.
		r.log.Warn().Str("bucket", r.cfg.Bucket).Dur("lease", r.cfg.TTL).
			Msg("serverlist: the registry bucket has no TTL: entries of crashed instances never expire; set the bucket's TTL (nats kv edit ... --ttl)")
		return nil
	case asked != 0 && asked != ttl && r.cfg.RequireTTL:
		return fmt.Errorf("%w: the lease is %v, the registry bucket %s's TTL is %v: the bucket belongs to the deployment and is not changed (leave the lease unset to take the bucket's, or change the bucket: nats kv edit %s --ttl %v)",
			ErrLeaseMismatch, asked, r.cfg.Bucket, ttl, r.cfg.Bucket, asked)
	case asked != 0 && asked != ttl:
		r.log.Warn().Str("bucket", r.cfg.Bucket).Dur("configured_lease", asked).Dur("bucket_ttl", ttl).
			Msg("serverlist: the configured lease disagrees with the registry bucket's TTL; using the bucket's (the bucket belongs to the deployment and is not changed)")
	}
	if marker <= 0 {
		r.log.Warn().Str("bucket", r.cfg.Bucket).
			Msg("serverlist: the registry bucket has no limit markers: lease expiries do not reach watchers, gateways notice them only at anti-entropy")
	}
	r.cfg.TTL, r.cfg.MarkerTTL = ttl, marker
	return nil
}

// Ensure makes sure the bucket exists, creating it from the registry's
// configuration (the TTL in effect) when it is gone, as after a NATS server
// lost its store. created reports whether it had to. A Registry keeps
// working over a recreated bucket of the same name.
func (r *Registry) Ensure(ctx context.Context) (created bool, err error) {
	_, err = r.js.KeyValue(ctx, r.cfg.Bucket)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return false, fmt.Errorf("serverlist: look up bucket %s: %w", r.cfg.Bucket, err)
	}
	if _, err := r.create(ctx); err != nil {
		return false, err
	}
	r.log.Warn().Str("bucket", r.cfg.Bucket).Dur("ttl", r.cfg.TTL).Msg("serverlist: the registry bucket was gone; recreated it")
	return true, nil
}

// Config returns the configuration in effect, defaults filled in; its TTL,
// MarkerTTL and Replicas are the bucket's as Open found or made it.
func (r *Registry) Config() RegistryConfig { return r.cfg }

// KeyValue returns the underlying bucket, for tools and tests.
func (r *Registry) KeyValue() jetstream.KeyValue { return r.kv }

// Register stores the instance and starts its lease, whatever the key held
// (last write wins; [Registry.Claim] is the identity-checking way in). It
// returns the entry's revision. An invalid instance is rejected with an
// error wrapping ErrInvalidInstance.
func (r *Registry) Register(ctx context.Context, in Instance) (revision uint64, err error) {
	key, val, err := encodeInstance(in)
	if err != nil {
		return 0, err
	}
	rev, err := r.kv.Put(ctx, key, val)
	if err != nil {
		return 0, fmt.Errorf("serverlist: register %s/%s: %w", in.Service, in.InstanceID, err)
	}
	return rev, nil
}

// Refresh renews the instance's lease by storing it again: the lease
// heartbeat. Call it well within TTL. If the lease had already expired, the
// entry comes back and watchers see a new put, so gateways that dropped the
// instance learn of it again.
func (r *Registry) Refresh(ctx context.Context, in Instance) (revision uint64, err error) {
	return r.Register(ctx, in)
}

// Deregister removes the instance, its record and then its lease, whoever
// holds them. Removing an absent instance is not an error. It purges the
// keys rather than deleting them: a purge marker is dropped when it ages
// out, whereas an aged-out delete marker would produce a second (expiry)
// marker.
func (r *Registry) Deregister(ctx context.Context, service, id string) error {
	key, err := EncodeKey(service, id)
	if err != nil {
		return err
	}
	if err := r.kv.Purge(ctx, key); err != nil {
		return fmt.Errorf("serverlist: deregister %s/%s: %w", service, id, err)
	}
	return r.DeleteLease(ctx, service, id)
}

// Entry is an instance with the bucket revision that stored it. Revisions
// are assigned by the server and grow with every write to the bucket: no
// client can forge their order.
type Entry struct {
	Instance
	// Revision is the bucket revision of the put that stored Instance.
	Revision uint64
}

// GetEntry is [Registry.Get] with the entry's revision.
func (r *Registry) GetEntry(ctx context.Context, service, id string) (Entry, error) {
	key, err := EncodeKey(service, id)
	if err != nil {
		return Entry{}, err
	}
	e, err := r.kv.Get(ctx, key)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return Entry{}, fmt.Errorf("%w: %s/%s", ErrNotFound, service, id)
		}
		return Entry{}, fmt.Errorf("serverlist: get %s/%s: %w", service, id, err)
	}
	in, err := decodeValue(service, id, e.Value())
	if err != nil {
		return Entry{}, err
	}
	return Entry{Instance: in, Revision: e.Revision()}, nil
}

// Create stores the instance only if its key holds no live entry (never
// written, deregistered or expired). It returns the entry's revision, or an
// error wrapping ErrExists.
func (r *Registry) Create(ctx context.Context, in Instance) (revision uint64, err error) {
	key, val, err := encodeInstance(in)
	if err != nil {
		return 0, err
	}
	rev, err := r.kv.Create(ctx, key, val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("%w: %s/%s", ErrExists, in.Service, in.InstanceID)
	}
	if err != nil {
		return 0, fmt.Errorf("serverlist: create %s/%s: %w", in.Service, in.InstanceID, err)
	}
	return rev, nil
}

// Update stores the instance only if its entry is still at revision (the
// one a Create, Update or GetEntry returned): a compare-and-set. It returns
// the new revision, or an error wrapping ErrRevisionMismatch when the entry
// was written or removed since.
func (r *Registry) Update(ctx context.Context, in Instance, revision uint64) (uint64, error) {
	key, val, err := encodeInstance(in)
	if err != nil {
		return 0, err
	}
	rev, err := r.kv.Update(ctx, key, val, revision)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("%w: %s/%s is no longer at revision %d", ErrRevisionMismatch, in.Service, in.InstanceID, revision)
	}
	if err != nil {
		return 0, fmt.Errorf("serverlist: update %s/%s: %w", in.Service, in.InstanceID, err)
	}
	return rev, nil
}

// DeregisterRevision removes the instance only if its entry is still at
// revision, so that a process removes its own record and never one that
// another process wrote since. The error wraps ErrRevisionMismatch
// otherwise.
func (r *Registry) DeregisterRevision(ctx context.Context, service, id string, revision uint64) error {
	key, err := EncodeKey(service, id)
	if err != nil {
		return err
	}
	err = r.kv.Purge(ctx, key, jetstream.LastRevision(revision))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("%w: %s/%s is no longer at revision %d", ErrRevisionMismatch, service, id, revision)
	}
	if err != nil {
		return fmt.Errorf("serverlist: deregister %s/%s: %w", service, id, err)
	}
	return nil
}

// DeregisterOwned removes the instance, record and lease, if its record
// names owner, and leaves those of another owner alone. An absent record is
// not an error.
func (r *Registry) DeregisterOwned(ctx context.Context, service, id, owner string) error {
	for range casAttempts {
		e, err := r.GetEntry(ctx, service, id)
		switch {
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrInvalidInstance):
			// Absent, or malformed and so not provably ours: the lease may
			// still be.
			return r.deleteLeaseOwned(ctx, service, id, owner)
		case err != nil:
			return err
		case e.Owner != owner:
			return nil
		}
		err = r.DeregisterRevision(ctx, service, id, e.Revision)
		if err == nil {
			return r.deleteLeaseOwned(ctx, service, id, owner)
		}
		if !errors.Is(err, ErrRevisionMismatch) {
			return err
		}
	}
	return fmt.Errorf("%w: %s/%s kept changing", ErrRevisionMismatch, service, id)
}

// casAttempts bounds the read-and-retry loops of conditional writes.
const casAttempts = 8

// encodeInstance validates in and returns its key and value.
func encodeInstance(in Instance) (key string, val []byte, err error) {
	if err := in.Validate(); err != nil {
		return "", nil, err
	}
	if key, err = EncodeKey(in.Service, in.InstanceID); err != nil {
		return "", nil, err
	}
	if val, err = json.Marshal(in); err != nil {
		return "", nil, fmt.Errorf("serverlist: encode %s: %w", key, err)
	}
	if len(val) > MaxValueSize {
		return "", nil, fmt.Errorf("%w: %s/%s: record of %d bytes, limit %d", ErrInvalidInstance, in.Service, in.InstanceID, len(val), MaxValueSize)
	}
	return key, val, nil
}

// MayHold reports whether the bucket may hold a record of service. It
// answers false only when no message of any of the service's keys is in
// the bucket (none was ever written, or all aged out): one request to the
// stream, no consumer, so that a client asked for invented names finds
// them absent cheaply. A service whose records were all removed may still
// answer true (their removal markers stay): a watch of its keys then
// tells. On an error (NATS away) it answers true with the error.
func (r *Registry) MayHold(ctx context.Context, service string) (bool, error) {
	if err := events.ValidateService(service); err != nil {
		return false, fmt.Errorf("serverlist: %w", err)
	}
	st, err := r.bucketStream(ctx)
	if err != nil {
		return true, fmt.Errorf("serverlist: %w", err)
	}
	_, err = st.GetLastMsgForSubject(ctx, "$KV."+r.cfg.Bucket+"."+service+".*")
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	case err != nil:
		return true, fmt.Errorf("serverlist: %w", err)
	}
	return true, nil
}

// Get reads one instance from the bucket. It returns an error wrapping
// ErrNotFound when the instance is absent, deregistered or expired, or
// marked down (Instance.Status): what a gateway may route to. GetEntry
// returns a record as it is.
func (r *Registry) Get(ctx context.Context, service, id string) (Instance, error) {
	e, err := r.GetEntry(ctx, service, id)
	if err == nil && !e.Routable() {
		return Instance{}, fmt.Errorf("%w: %s/%s is marked down", ErrNotFound, service, id)
	}
	return e.Instance, err
}

// List returns the live instances of one service, or of every service when
// service is "", sorted by service and instance ID. Malformed entries are
// logged, counted (see [Registry.Malformed]) and skipped.
func (r *Registry) List(ctx context.Context, service string) ([]Instance, error) {
	filter := RecordKeys
	if service != "" {
		if err := validateService(service); err != nil {
			return nil, err
		}
		filter = service + ".*"
	}
	// The client keeps a goroutine per watch until its context ends.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := r.kv.Watch(wctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("serverlist: list %q: %w", service, err)
	}
	defer stopWatcher(w)

	var out []Instance
	// A key's place in out (a rewrite during the list replaces it), -1
	// for a malformed value: every key the watch gave.
	at := map[string]int{}
	add := func(key string, value []byte) {
		in, err := decodeEntry(key, value)
		if err != nil {
			r.malformed.Add(1)
			r.log.Warn().Err(err).Str("key", key).Msg("serverlist: skipping malformed registry entry")
			at[key] = -1
			return
		}
		if i, ok := at[key]; ok && i >= 0 {
			out[i] = in
			return
		}
		at[key] = len(out)
		out = append(out, in)
	}
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("serverlist: list %q: %w", service, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("serverlist: list %q: watcher closed", service)
			}
			if e != nil {
				add(e.Key(), e.Value())
				continue
			}
			// All current values delivered, but for a record rewritten
			// as the watch started: nats-server can leave it out of the
			// initial values and deliver its new revision after the
			// marker (about 1 % of lists during a write of one of their
			// records). The stream's subjects name the keys it has; those
			// the watch did not give are read one by one.
			missed, err := r.keysBesides(ctx, filter, at)
			if err != nil {
				return nil, fmt.Errorf("serverlist: list %q: %w", service, err)
			}
			for _, key := range missed {
				e, err := r.kv.Get(ctx, key)
				switch {
				case errors.Is(err, jetstream.ErrKeyNotFound):
					// Deleted or purged: a tombstone's subject.
				case err != nil:
					return nil, fmt.Errorf("serverlist: list %q: %w", service, err)
				default:
					add(key, e.Value())
				}
			}
			slices.SortFunc(out, compareInstances)
			return out, nil
		}
	}
}

// keysBesides returns the keys matching filter that the bucket's stream
// holds a message for (a value or a tombstone), less those in seen.
func (r *Registry) keysBesides(ctx context.Context, filter string, seen map[string]int) ([]string, error) {
	st, err := r.bucketStream(ctx)
	if err != nil {
		return nil, err
	}
	prefix := "$KV." + r.cfg.Bucket + "."
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+filter))
	if err != nil {
		return nil, fmt.Errorf("the registry's stream: %w", err)
	}
	var keys []string
	for subject := range info.State.Subjects {
		key := strings.TrimPrefix(subject, prefix)
		if _, ok := seen[key]; !ok {
			keys = append(keys, key)
		}
	}
	return keys, nil
}

// bucketStream returns the bucket's stream, fetched once.
func (r *Registry) bucketStream(ctx context.Context) (jetstream.Stream, error) {
	if stp := r.stream.Load(); stp != nil {
		return *stp, nil
	}
	st, err := r.js.Stream(ctx, "KV_"+r.cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("the registry's stream: %w", err)
	}
	r.stream.Store(&st)
	return st, nil
}

// Malformed is the number of malformed entries List has skipped.
func (r *Registry) Malformed() uint64 { return r.malformed.Load() }

// decodeEntry decodes a KV entry's key and value into an Instance.
func decodeEntry(key string, value []byte) (Instance, error) {
	service, id, err := DecodeKey(key)
	if err != nil {
		return Instance{}, err
	}
	return decodeValue(service, id, value)
}

// decodeValue decodes and validates the value stored under the key of
// service/id. A value that names another instance than its key is invalid.
func decodeValue(service, id string, value []byte) (Instance, error) {
	return decodeValueShared(service, id, value, nil)
}

// decodeValueShared is decodeValue taking the strings records repeat from
// x (nil: none), through parseInstance when the value has the usual shape.
func decodeValueShared(service, id string, value []byte, x *interner) (Instance, error) {
	if len(value) > MaxValueSize {
		return Instance{}, fmt.Errorf("%w: %s/%s: value of %d bytes, limit %d", ErrInvalidInstance, service, id, len(value), MaxValueSize)
	}
	in, ok := parseInstance(value, service, id, x)
	if !ok {
		if err := json.Unmarshal(value, &in); err != nil {
			return Instance{}, fmt.Errorf("%w: %s/%s: %w", ErrInvalidInstance, service, id, err)
		}
	}
	if err := in.Validate(); err != nil {
		return Instance{}, err
	}
	if in.Service != service || in.InstanceID != id {
		return Instance{}, fmt.Errorf("%w: key is %s/%s but value is %s/%s", ErrInvalidInstance, service, id, in.Service, in.InstanceID)
	}
	return in, nil
}

func compareInstances(a, b Instance) int {
	if c := strings.Compare(a.Service, b.Service); c != 0 {
		return c
	}
	return strings.Compare(a.InstanceID, b.InstanceID)
}

// stopWatcher stops w and drains its channel until the client closes it. The
// client delivers under a lock and blocks while the channel is full, so an
// undrained watcher would leave the client's delivery goroutine stuck.
func stopWatcher(w jetstream.KeyWatcher) { <-stopWatcherAsync(w, nil) }

// stopWatcherAsync is stopWatcher that does not wait for the deletion of
// the watch's consumer when stopping is set: nats.go closes the watch's
// channel as it unsubscribes, then asks the server to delete the consumer
// and waits for the answer, up to its request timeout (5 s) when the
// server's JetStream cannot answer: a node cut from its cluster, which is
// when the mirror stops its watches to resync through another node. That
// request then runs on in a goroutine that stopping counts. The channel
// returned is closed once the deletion has ended.
func stopWatcherAsync(w jetstream.KeyWatcher, stopping *sync.WaitGroup) <-chan struct{} {
	deleted := make(chan struct{})
	if stopping == nil {
		_ = w.Stop()
		close(deleted)
	} else {
		stopping.Go(func() {
			defer close(deleted)
			_ = w.Stop()
		})
	}
	drain(w)
	return deleted
}

// drain drops w's updates until the client closes its channel, or for
// watchDrainTimeout at most; closed reports which.
func drain(w jetstream.KeyWatcher) (closed bool) {
	timer := time.NewTimer(watchDrainTimeout)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return true
			}
		case <-timer.C:
			return false
		}
	}
}
