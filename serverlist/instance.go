package serverlist

import (
	"fmt"
	"maps"
	"net"
	"strconv"

	"github.com/pushlb/pushlb/events"
)

// Instance is the registry's record of one running instance of a service:
// the value stored under its key in the registry bucket (wire protocol,
// docs/protocol.md). Field names in JSON are a contract with publishers
// written in other languages.
type Instance struct {
	// Service is the service name, NATS-token safe: [A-Za-z0-9_-]+, at most
	// events.MaxServiceLength bytes.
	Service string `json:"service"`
	// InstanceID is opaque: any valid UTF-8 without control characters, 1 to
	// events.MaxInstanceIDLength bytes. Eureka-style "host:service:port" IDs are fine.
	InstanceID string `json:"instanceId"`
	// Host is the host name or IP address to dial.
	Host string `json:"host"`
	// Port is the port to dial, 1 to 65535.
	Port int `json:"port"`
	// Secure says the instance speaks TLS (https).
	Secure bool `json:"secure"`
	// Zone is the instance's availability zone; empty means unknown.
	Zone string `json:"zone"`
	// Region is the instance's region (announce -region); empty means
	// the registry's own. A gateway with a region of its own routes to
	// the nearest region that has a reachable instance (balancer.Config's
	// Region). Optional: records written before regions have none.
	Region string `json:"region,omitempty"`
	// Metadata holds free-form labels: at most MaxMetadataEntries, keys of
	// at most MaxMetadataKeyLen bytes, values of at most
	// MaxMetadataValueLen bytes.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Weight is the instance's share of its service's traffic relative to
	// the others, MinWeight to MaxWeight; 0 (absent from the JSON, as in
	// records written before weights existed) means DefaultWeight. See
	// [Instance.EffectiveWeight].
	Weight int `json:"weight,omitempty"`
	// Incarnation grows with every start of the instance (for example its
	// start time in nanoseconds); it orders events about the same ID.
	Incarnation int64 `json:"incarnation"`
	// GossipNode and GossipAddr name the instance's gossip (memberlist) node
	// and its advertised "host:port", when the instance gossips. Optional:
	// a gateway accepts a gossip report that the instance died (or came
	// back) only from the node named here, and ignores gossip about an
	// instance whose record names none.
	GossipNode string `json:"gossipNode,omitempty"`
	GossipAddr string `json:"gossipAddr,omitempty"`
	// Owner is an opaque token naming the process that holds the instance
	// ID (a publisher makes a random one per process). A process that finds
	// the record under its key with another owner knows it was overwritten;
	// see [Registry.Claim]. Empty for publishers that do not claim.
	Owner string `json:"owner,omitempty"`
	// NATSServerID and NATSClientID name the NATS connection that holds the
	// record, as the server reports it: the server's ID (its INFO's
	// server_id) and the client ID it gave the connection (client_id).
	// Optional: a gateway that receives the server's client-disconnect
	// advisory for exactly this connection probes the instance at once
	// (docs/protocol.md, "Crash detection"); an advisory about any other
	// connection concerns no instance. A publisher rewrites them after it
	// reconnects.
	NATSServerID string `json:"natsServerId,omitempty"`
	NATSClientID uint64 `json:"natsClientId,omitempty"`
	// Status is empty for an instance that serves, or StatusDown for one
	// whose health check fails (announce -health-interval,
	// publisher.MarkDown): its record stays, with its lease, as Eureka's
	// DOWN status or a failing Consul check, but no gateway routes to it;
	// a gateway reads the record as absent (Registry.Get, the mirror).
	// Optional; other values are invalid.
	Status string `json:"status,omitempty"`
}

// StatusDown is the Status of an instance marked down (Instance.Status).
const StatusDown = "down"

// Routable reports whether gateways route to the instance: its record is
// not marked down.
func (in Instance) Routable() bool { return in.Status != StatusDown }

// Connection is the NATS connection that holds a record: its server's ID
// and the client ID that server gave it (Instance.NATSServerID,
// NATSClientID). The zero value names none.
type Connection struct {
	ServerID string
	ClientID uint64
}

// IsZero reports whether c names no connection.
func (c Connection) IsZero() bool { return c.ServerID == "" || c.ClientID == 0 }

// Connection returns the NATS connection the record names (zero for none).
func (in Instance) Connection() Connection {
	return Connection{ServerID: in.NATSServerID, ClientID: in.NATSClientID}
}

// Validate reports whether the instance may be stored. Every error wraps
// ErrInvalidInstance.
func (in Instance) Validate() error {
	if err := validateService(in.Service); err != nil {
		return err
	}
	if err := validateInstanceID(in.InstanceID); err != nil {
		return err
	}
	if in.Host == "" {
		return fmt.Errorf("%w: empty host", ErrInvalidInstance)
	}
	if in.Port < 1 || in.Port > 65535 {
		return fmt.Errorf("%w: port %d out of range 1..65535", ErrInvalidInstance, in.Port)
	}
	if len(in.Host) > maxHostLen || len(in.Zone) > maxZoneLen || len(in.Region) > maxZoneLen {
		return fmt.Errorf("%w: host, zone or region longer than %d / %d / %d bytes", ErrInvalidInstance, maxHostLen, maxZoneLen, maxZoneLen)
	}
	if len(in.NATSServerID) > maxServerIDLen {
		return fmt.Errorf("%w: NATS server ID longer than %d bytes", ErrInvalidInstance, maxServerIDLen)
	}
	if in.Status != "" && in.Status != StatusDown {
		return fmt.Errorf("%w: status %.40q: empty or %q", ErrInvalidInstance, in.Status, StatusDown)
	}
	if in.Weight != 0 && (in.Weight < MinWeight || in.Weight > MaxWeight) {
		return fmt.Errorf("%w: weight %d out of range %d..%d", ErrInvalidInstance, in.Weight, MinWeight, MaxWeight)
	}
	if len(in.Metadata) > MaxMetadataEntries {
		return fmt.Errorf("%w: %d metadata entries, limit %d", ErrInvalidInstance, len(in.Metadata), MaxMetadataEntries)
	}
	for k, v := range in.Metadata {
		if len(k) > MaxMetadataKeyLen || len(v) > MaxMetadataValueLen {
			return fmt.Errorf("%w: metadata %.40q: key or value too long (limits %d and %d bytes)", ErrInvalidInstance, k, MaxMetadataKeyLen, MaxMetadataValueLen)
		}
	}
	return nil
}

// Limits of a registry record (wire protocol: docs/protocol.md). A value
// beyond them is rejected when written and skipped (counted as malformed)
// when read, so that no writer can grow every gateway's memory: the
// bucket's MaxValueSize is MaxValueSize.
const (
	// MaxValueSize bounds the JSON of one record.
	MaxValueSize = 16 << 10
	// MaxMetadataEntries bounds the metadata labels of one instance.
	MaxMetadataEntries = 64
	// MaxMetadataKeyLen and MaxMetadataValueLen bound one label.
	MaxMetadataKeyLen   = 128
	MaxMetadataValueLen = 1024

	maxHostLen = 255 // a DNS name
	maxZoneLen = 128
	// maxServerIDLen bounds a NATS server ID (56 characters: a public
	// NKey).
	maxServerIDLen = 128
)

// Instance weights (Instance.Weight), as Nacos's and Envoy's: relative
// shares of a service's traffic.
const (
	MinWeight     = 1
	MaxWeight     = 1000
	DefaultWeight = 100
)

// EffectiveWeight returns the instance's weight: Weight, or DefaultWeight
// when it is 0 (not set).
func (in Instance) EffectiveWeight() int {
	if in.Weight == 0 {
		return DefaultWeight
	}
	return in.Weight
}

// Addr is host:port, with IPv6 hosts bracketed.
func (in Instance) Addr() string {
	return net.JoinHostPort(in.Host, strconv.Itoa(in.Port))
}

// ProbeTarget is the address a probe of the instance connects to
// (docs/protocol.md, section 7), and its kind: its gossip node when the
// record names one (it runs in the process that holds the instance's ID
// and NATS connection), "gossip", else its service address, "service".
func (in Instance) ProbeTarget() (addr, kind string) {
	if in.GossipAddr != "" {
		return in.GossipAddr, "gossip"
	}
	return in.Addr(), "service"
}

// Clone returns a copy that shares no memory with in.
func (in Instance) Clone() Instance {
	in.Metadata = maps.Clone(in.Metadata)
	return in
}

// Equal reports whether two instances hold the same values. A nil and an
// empty Metadata are equal.
func (in Instance) Equal(other Instance) bool {
	return in.Service == other.Service &&
		in.InstanceID == other.InstanceID &&
		in.Host == other.Host &&
		in.Port == other.Port &&
		in.Secure == other.Secure &&
		in.Zone == other.Zone &&
		in.Region == other.Region &&
		in.EffectiveWeight() == other.EffectiveWeight() &&
		in.Incarnation == other.Incarnation &&
		in.Owner == other.Owner &&
		in.GossipNode == other.GossipNode &&
		in.GossipAddr == other.GossipAddr &&
		in.NATSServerID == other.NATSServerID &&
		in.NATSClientID == other.NATSClientID &&
		maps.Equal(in.Metadata, other.Metadata)
}

// validateService and validateInstanceID apply the wire protocol's rules
// (events package), reported as ErrInvalidInstance.
func validateService(service string) error {
	if err := events.ValidateService(service); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidInstance, err)
	}
	return nil
}

func validateInstanceID(id string) error {
	if err := events.ValidateInstanceID(id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidInstance, err)
	}
	return nil
}
