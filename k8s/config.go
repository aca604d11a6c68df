package pushlbk8s

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/metadata"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/serverlist"
)

// Annotations a bridged Service may carry.
const (
	// AnnotationService names the pushlb service its endpoints are
	// announced under; without it, the Service's name.
	AnnotationService = "pushlb.io/service"
	// AnnotationPort names the Service port to announce; without it, the
	// Service's only port (a Service of several ports without it is
	// counted as malformed and bridges nothing).
	AnnotationPort = "pushlb.io/port"
	// AnnotationSecure set to "true" announces the endpoints as TLS
	// (Instance.Secure); so does the port's appProtocol "https".
	AnnotationSecure = "pushlb.io/secure"
)

// Metadata keys the bridge writes into every record, beside the chosen pod
// labels.
const (
	// MetaService is "<namespace>/<name>" of the Service the record was
	// bridged from: a new leader adopts only the records of the Services
	// it bridges.
	MetaService = "k8s.service"
	// MetaNode is the endpoint's node name, when it has one.
	MetaNode = "k8s.node"
)

// DefaultOwner is the Owner of the records the bridge writes when
// Config.Owner is empty.
const DefaultOwner = "pushlb-k8s"

// maxPodLabels leaves room in a record's metadata
// (serverlist.MaxMetadataEntries) for the bridge's own keys.
const maxPodLabels = serverlist.MaxMetadataEntries - 4

// Config tunes a [Bridge]. The zero value bridges every Service with
// DefaultSelector in every namespace.
type Config struct {
	// Namespaces are the namespaces watched; empty means all.
	Namespaces []string
	// Selector chooses the Services bridged, by label; nil means
	// DefaultSelector ("pushlb.io/bridge=true").
	Selector labels.Selector
	// PodLabels are the pod labels copied into each record's metadata
	// (key as is). Empty: no Pod is watched.
	PodLabels []string
	// Metadata is the client of the Pods' metadata (labels), watched with
	// a metadata-only informer (no pod specs in memory): required with
	// PodLabels (metadata.NewForConfig of the clientset's configuration).
	Metadata metadata.Interface
	// Owner is the Owner token of the records the bridge writes, shared
	// by its replicas: empty means DefaultOwner. Two bridges of different
	// clusters writing into one registry need different owners.
	Owner string
	// Prefix is the events' subject prefix; empty means events.DefaultPrefix.
	Prefix string
	// RenewInterval is how often the leader re-puts its records, their
	// lease; zero means a third of the registry's TTL.
	RenewInterval time.Duration
	// Workers is how many Services are reconciled at once; zero means 4.
	Workers int
	// WriteConcurrency bounds the registry writes one reconciliation
	// issues at once; zero means 64.
	WriteConcurrency int
	// Election configures the leader election.
	Election ElectionConfig
	// Logger receives the bridge's logs; the zero value logs nothing.
	Logger zerolog.Logger
	// Registerer, when set, registers the bridge's metrics.
	Registerer prometheus.Registerer
}

// ElectionConfig is the leader election's Lease and timing (client-go's
// leaderelection.LeaderElectionConfig).
type ElectionConfig struct {
	// Namespace and Name locate the coordination.k8s.io Lease; Name empty
	// means "pushlb-k8s", Namespace empty means "default".
	Namespace, Name string
	// Identity names this replica (its pod name); empty means the host
	// name with a random suffix.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod: zero means 15 s, 10 s
	// and 2 s, client-go's usual values. A crashed leader is replaced
	// after LeaseDuration at most; a leader that stops releases the Lease
	// at once.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// DefaultSelector is the label a Service carries to be bridged when
// Config.Selector is nil.
const DefaultSelector = "pushlb.io/bridge=true"

func (c Config) withDefaults() (Config, error) {
	if c.Selector == nil {
		sel, err := labels.Parse(DefaultSelector)
		if err != nil {
			return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		c.Selector = sel
	}
	if c.Owner == "" {
		c.Owner = DefaultOwner
	}
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.WriteConcurrency == 0 {
		c.WriteConcurrency = 64
	}
	if len(c.PodLabels) > 0 && c.Metadata == nil {
		return c, fmt.Errorf("%w: PodLabels need a Metadata client", ErrInvalidConfig)
	}
	if len(c.PodLabels) > maxPodLabels {
		return c, fmt.Errorf("%w: %d pod labels, at most %d", ErrInvalidConfig, len(c.PodLabels), maxPodLabels)
	}
	if c.Workers < 0 || c.WriteConcurrency < 0 || c.RenewInterval < 0 {
		return c, fmt.Errorf("%w: negative workers, write concurrency or renew interval", ErrInvalidConfig)
	}
	e := &c.Election
	if e.Name == "" {
		e.Name = "pushlb-k8s"
	}
	if e.Namespace == "" {
		e.Namespace = "default"
	}
	if e.LeaseDuration == 0 {
		e.LeaseDuration = 15 * time.Second
	}
	if e.RenewDeadline == 0 {
		e.RenewDeadline = 10 * time.Second
	}
	if e.RetryPeriod == 0 {
		e.RetryPeriod = 2 * time.Second
	}
	if e.RenewDeadline >= e.LeaseDuration || e.RetryPeriod >= e.RenewDeadline {
		return c, fmt.Errorf("%w: election needs RetryPeriod < RenewDeadline < LeaseDuration", ErrInvalidConfig)
	}
	return c, nil
}
