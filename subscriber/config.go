package subscriber

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// Defaults of Config.
const (
	// DefaultCoalesce is the least time between two deliveries for one
	// service.
	DefaultCoalesce = 10 * time.Millisecond
	// DefaultAntiEntropy is the interval of full reconciliations with the
	// registry.
	DefaultAntiEntropy = 60 * time.Second
	// DefaultTombstoneTTL is how long offline instances are remembered.
	DefaultTombstoneTTL = 10 * time.Minute
	// DefaultRegistryTimeout bounds each direct registry read.
	DefaultRegistryTimeout = 2 * time.Second
	// DefaultConfirmWithin is how long an instance known only from events
	// may wait for the registry to show it.
	DefaultConfirmWithin = 5 * time.Second
	// DefaultMaxUnconfirmed bounds the instances known only from events.
	DefaultMaxUnconfirmed = 10000
	// DefaultMaxServices bounds the services events may add.
	DefaultMaxServices = 10000
	// DefaultMaxInstancesPerService bounds the instances of one service
	// events may add.
	DefaultMaxInstancesPerService = 10000
)

// Config configures a Subscriber. Zero values take the defaults.
type Config struct {
	// Prefix is the subject prefix. Default events.DefaultPrefix ("lb").
	Prefix string
	// Region is the region this subscriber runs in (pushlb.Config.Region),
	// at most events.MaxRegionLength bytes. With it, an event that names
	// another region (events.Event.Region, compared without regard to
	// ASCII case, as balancers compare regions) is dropped before it
	// touches any state and counted (DropOtherRegion): NATS forwards
	// events between regions' clusters, and instance IDs are unique within
	// a region only, so another region's offline must not remove an
	// instance of this one. Another region's instances come from the
	// registry alone (their replicated records). An event that names no
	// region is taken as of this region (announcers that predate regions).
	// Empty: every event is taken.
	Region string
	// Services are services followed from the start and always: with
	// Services or Scoped set, the subscriber follows these and those given
	// to Follow only (their events, and their records: the mirror is
	// scoped). Empty, and Scoped false: every service is followed
	// (<prefix>.svc.>, every record).
	Services []string
	// Scoped makes the subscriber follow Services and the services given
	// to Follow only, even when Services is empty. Set whenever Services
	// is not empty.
	Scoped bool
	// Coalesce is the minimum time between two deliveries for one service.
	// The first change after a quiet period is delivered at once. Zero
	// means DefaultCoalesce (10 ms); a negative value disables coalescing.
	Coalesce time.Duration
	// AntiEntropy is the interval of full reconciliations with the
	// registry. Zero means DefaultAntiEntropy (60 s).
	AntiEntropy time.Duration
	// TombstoneTTL is how long offline instances are remembered to reject
	// late events of old incarnations. Zero means DefaultTombstoneTTL
	// (10 min).
	TombstoneTTL time.Duration
	// RegistryTimeout bounds each direct registry read. Zero means
	// DefaultRegistryTimeout (2 s).
	RegistryTimeout time.Duration

	// ConfirmWithin is how long an instance known only from events (or
	// gossip) stays in the table without the registry showing it. An
	// announcer registers before it announces, so a real instance is
	// confirmed within the mirror's lag; an event naming an instance nobody
	// registered is forgotten after this long (counted in
	// Stats.Unconfirmed), while the mirror is synced. Zero means
	// DefaultConfirmWithin (5 s).
	ConfirmWithin time.Duration
	// MaxUnconfirmed bounds the instances known only from events; an event
	// that would add one more is dropped (DropLimit). Zero means
	// DefaultMaxUnconfirmed (10,000); negative means no limit.
	MaxUnconfirmed int
	// MaxServices and MaxInstancesPerService bound the services, and the
	// instances of one service, that events may add; instances the
	// registry holds are always followed. Zero means the defaults (10,000
	// each); negative means no limit.
	MaxServices, MaxInstancesPerService int
	// Mirror configures the registry mirror the subscriber owns (its
	// OnChange is the subscriber's).
	Mirror serverlist.MirrorConfig
	// Logger receives drops (rate-limited) and failures. Zero: no logs.
	Logger zerolog.Logger
	// AdvisorySubject is the subject on which the NATS server's
	// client-disconnect advisories of this account arrive
	// (events.DisconnectAdvisorySubject(Prefix) where the deployment
	// imports them; docs/protocol.md, "Crash detection"). An advisory that
	// names the connection of an instance's record starts a probe of the
	// instance, which is removed at once if nothing answers. Start checks
	// that advisories arrive and logs once if they do not. Empty: not
	// followed; crashes are detected by gossip and leases.
	AdvisorySubject string
	// ProbeTimeout bounds one connect of a probe. Zero means
	// DefaultProbeTimeout (250 ms).
	ProbeTimeout time.Duration
	// AdvisoryCheck is how long Start's check of the advisories waits for
	// its connection's advisory. Zero means DefaultAdvisoryCheck (5 s).
	AdvisoryCheck time.Duration
	// OnEvent, if set, is called with every valid event of a followed
	// service, before it is applied (for metrics such as the propagation
	// lag, time.Since(e.At)). It runs on the NATS delivery goroutine: it must
	// be quick and must not block.
	OnEvent func(e events.Event)
}

// withDefaults returns c with the defaults in place of its zero fields, or
// an error wrapping ErrInvalidConfig that names the first invalid field.
func (c Config) withDefaults() (Config, error) {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if err := events.ValidatePrefix(c.Prefix); err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Region != "" {
		if err := events.ValidateRegion(c.Region); err != nil {
			return c, fmt.Errorf("%w: region: %w", ErrInvalidConfig, err)
		}
	}
	for _, s := range c.Services {
		if err := events.ValidateService(s); err != nil {
			return c, fmt.Errorf("%w: services: %w", ErrInvalidConfig, err)
		}
	}
	c.Scoped = c.Scoped || len(c.Services) > 0
	if c.Coalesce == 0 {
		c.Coalesce = DefaultCoalesce
	}
	if c.AntiEntropy == 0 {
		c.AntiEntropy = DefaultAntiEntropy
	}
	if c.TombstoneTTL == 0 {
		c.TombstoneTTL = DefaultTombstoneTTL
	}
	if c.RegistryTimeout == 0 {
		c.RegistryTimeout = DefaultRegistryTimeout
	}
	if c.ConfirmWithin == 0 {
		c.ConfirmWithin = DefaultConfirmWithin
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if c.AdvisoryCheck == 0 {
		c.AdvisoryCheck = DefaultAdvisoryCheck
	}
	if c.AdvisorySubject != "" {
		// Literal tokens, as a prefix's: no wildcard, no '$'.
		if err := events.ValidatePrefix(c.AdvisorySubject); err != nil {
			return c, fmt.Errorf("%w: advisory subject: %w", ErrInvalidConfig, err)
		}
	}
	for _, l := range []struct {
		v   *int
		def int
	}{{&c.MaxUnconfirmed, DefaultMaxUnconfirmed}, {&c.MaxServices, DefaultMaxServices}, {&c.MaxInstancesPerService, DefaultMaxInstancesPerService}} {
		switch {
		case *l.v == 0:
			*l.v = l.def
		case *l.v < 0:
			*l.v = 0 // no limit
		}
	}
	if c.AntiEntropy < 0 || c.TombstoneTTL < 0 || c.RegistryTimeout < 0 || c.ConfirmWithin < 0 || c.ProbeTimeout < 0 || c.AdvisoryCheck < 0 {
		return c, fmt.Errorf("%w: negative interval", ErrInvalidConfig)
	}
	return c, nil
}
