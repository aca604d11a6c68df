package gossip

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
)

// MaxMetaSize is the largest JSON encoding of a Meta that a node may gossip.
// It is memberlist's own limit on node metadata.
const MaxMetaSize = memberlist.MetaMaxSize

// MaxNodeNameLength is the longest node name, in bytes, that New accepts
// and that the default names are cut to. Every gossip message carries the
// name, so it must stay small next to a 1400-byte UDP packet.
const MaxNodeNameLength = 128

// Role says what kind of process a node is.
type Role string

const (
	// RoleInstance is a service instance: it gossips so that a crash is
	// noticed by the gateways, and its Meta names the instance.
	RoleInstance Role = "instance"

	// RoleGateway is an API gateway: it watches instances come and go.
	RoleGateway Role = "gateway"
)

// Meta is what a node says about itself. It travels JSON-encoded in
// memberlist's node metadata, so its encoding must fit in MaxMetaSize bytes;
// New and UpdateMeta check that.
//
// For an instance, Service, InstanceID and Incarnation are the same values
// its NATS announcements carry, so a gateway can map a dead node to the
// instance to drop, and ignore the death of an older incarnation of an
// instance that has already restarted.
type Meta struct {
	// Role is RoleInstance or RoleGateway. Required.
	Role Role `json:"role"`

	// Service is the instance's service name. Required for instances,
	// optional for gateways.
	Service string `json:"service,omitempty"`

	// InstanceID is the instance's opaque ID. Required for instances.
	InstanceID string `json:"instanceId,omitempty"`

	// Incarnation grows with every start of the instance (for example its
	// start time in nanoseconds). Must be positive for instances; zero for
	// gateways.
	Incarnation int64 `json:"incarnation,omitempty"`
}

// Validate reports whether m can be gossiped: a known Role, the fields an
// instance needs, valid UTF-8, and an encoding that fits in MaxMetaSize bytes
// (with room for the flag Leave adds). The error wraps ErrInvalidMeta or
// ErrMetaTooLarge.
func (m Meta) Validate() error {
	_, err := m.encode(false)
	return err
}

// wireMeta is what travels in memberlist's node metadata: the Meta plus the
// flag Leave sets before it leaves. memberlist does not tell its event
// delegate whether a node left or was declared dead (hashicorp/memberlist
// issues #266 and #293: Node.State is never set), so a node announces its
// leave first, in its metadata, as Serf announces a leave intent first.
type wireMeta struct {
	Meta
	Leaving bool `json:"leaving,omitempty"`
}

// encode validates m and returns its encoding, with the leaving flag when
// leaving is set. The size is checked with the flag, so that Leave never
// exceeds the limit that New accepted.
func (m Meta) encode(leaving bool) ([]byte, error) {
	switch m.Role {
	case RoleInstance:
		if m.Service == "" {
			return nil, fmt.Errorf("%w: instance without service", ErrInvalidMeta)
		}
		if m.InstanceID == "" {
			return nil, fmt.Errorf("%w: instance without instanceId", ErrInvalidMeta)
		}
		if m.Incarnation <= 0 {
			return nil, fmt.Errorf("%w: instance incarnation %d is not positive", ErrInvalidMeta, m.Incarnation)
		}
	case RoleGateway:
	default:
		return nil, fmt.Errorf("%w: unknown role %q", ErrInvalidMeta, m.Role)
	}
	if !utf8.ValidString(m.Service) || !utf8.ValidString(m.InstanceID) {
		// JSON would silently replace the bad bytes, and the gateway would
		// then see an ID that the instance never announced.
		return nil, fmt.Errorf("%w: service or instanceId is not valid UTF-8", ErrInvalidMeta)
	}
	withFlag, err := json.Marshal(wireMeta{Meta: m, Leaving: true})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidMeta, err)
	}
	if len(withFlag) > MaxMetaSize {
		return nil, fmt.Errorf("%w: %d bytes encoded with the leave flag, limit %d",
			ErrMetaTooLarge, len(withFlag), MaxMetaSize)
	}
	if leaving {
		return withFlag, nil
	}
	return json.Marshal(wireMeta{Meta: m})
}

// decodeMeta parses and validates the metadata of a remote node and reports
// whether it is leaving.
func decodeMeta(b []byte) (Meta, bool, error) {
	if len(b) > MaxMetaSize {
		return Meta{}, false, fmt.Errorf("%w: %d bytes", ErrMetaTooLarge, len(b))
	}
	var w wireMeta
	if err := json.Unmarshal(b, &w); err != nil {
		return Meta{}, false, fmt.Errorf("%w: %v", ErrInvalidMeta, err)
	}
	if err := w.Meta.Validate(); err != nil {
		return Meta{}, false, err
	}
	return w.Meta, w.Leaving, nil
}

// DefaultNodeName returns the node name New gives a node when
// Config.NodeName is empty. Names must be unique in the cluster, and memberlist refuses a known
// name from a new address, so every start of a process gets a new name:
//
//   - an instance is named "<service>/<instanceId>/<incarnation>", which is
//     unique because the incarnation grows with every start;
//   - a gateway is named "gateway-<hostname>-<8 random hex digits>".
//
// A name longer than MaxNodeNameLength bytes keeps its first 111 bytes (cut
// at a UTF-8 boundary) followed by "~" and the first 16 hex digits of the
// SHA-256 of the whole name, so it stays unique and still readable. The Meta,
// not the name, is what identifies an instance to a gateway.
func DefaultNodeName(m Meta) string {
	var name string
	if m.Role == RoleInstance {
		name = m.Service + "/" + m.InstanceID + "/" + strconv.FormatInt(m.Incarnation, 10)
	} else {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "unknown"
		}
		name = fmt.Sprintf("gateway-%s-%08x", host, rand.Uint32())
	}
	return shortenName(name)
}

// shortenName cuts name to MaxNodeNameLength bytes as DefaultNodeName
// documents.
func shortenName(name string) string {
	if len(name) <= MaxNodeNameLength {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	suffix := "~" + hex.EncodeToString(sum[:8])
	cut := MaxNodeNameLength - len(suffix)
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + suffix
}
