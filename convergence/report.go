package convergence

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pushlb/pushlb/events"
)

// Version is the report format's version.
const Version = 1

// MaxReportSize bounds an encoded report; a Reporter leaves services out
// beyond it (Report.Truncated), and a Viewer drops a larger message.
const MaxReportSize = 512 << 10

// Report is what one gateway has applied, per service.
type Report struct {
	// V is the format's version (Version).
	V int `json:"v"`
	// Gateway is the reporting gateway's ID: the last token of the
	// subject, which a Viewer checks.
	Gateway string `json:"gateway"`
	// At is when the report was made; Seq counts the gateway's reports
	// from 1, so that a Viewer keeps the newest.
	At  time.Time `json:"at"`
	Seq uint64    `json:"seq"`
	// Services maps each service the gateway follows to what it applied.
	Services map[string]Applied `json:"services"`
	// Truncated says services were left out to keep the report within
	// MaxReportSize.
	Truncated bool `json:"truncated,omitempty"`
}

// Applied is what a gateway applied of one service: the registry revision
// its list reflects, the list's digest, and when it applied that list.
type Applied struct {
	Revision uint64 `json:"revision"`
	// Digest sums the list's instances (docs/protocol.md §8): two
	// gateways with the same digest hold the same list, whatever their
	// revisions (a lease refresh moves the revision, not the list). Empty
	// when the reporter does not say.
	Digest string    `json:"digest,omitempty"`
	At     time.Time `json:"at"`
}

// Subject returns the subject of id's reports: <prefix>.report.<id>.
func Subject(prefix, id string) string { return prefix + ".report." + id }

// WildcardSubject returns <prefix>.report.*, every gateway's reports.
func WildcardSubject(prefix string) string { return prefix + ".report.*" }

// ErrInvalidReport is wrapped by the errors of Decode.
var ErrInvalidReport = errors.New("convergence: invalid report")

// ValidateID checks a gateway ID: one subject token of [A-Za-z0-9_-], at
// most events.MaxServiceLength bytes (the rules of a service name).
func ValidateID(id string) error {
	if err := events.ValidateService(id); err != nil {
		return fmt.Errorf("convergence: gateway ID: %w", err)
	}
	return nil
}

// Decode decodes the report received on subject under prefix: its size,
// version, gateway (the subject's last token) and service names are
// checked.
func Decode(prefix, subject string, data []byte) (Report, error) {
	var r Report
	if len(data) > MaxReportSize {
		return r, fmt.Errorf("%w: %d bytes, limit %d", ErrInvalidReport, len(data), MaxReportSize)
	}
	id, ok := cutPrefix(subject, prefix+".report.")
	if !ok || ValidateID(id) != nil {
		return r, fmt.Errorf("%w: subject %q is not %s", ErrInvalidReport, truncate(subject), Subject(prefix, "<id>"))
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("%w: %w", ErrInvalidReport, err)
	}
	switch {
	case r.V != Version:
		return r, fmt.Errorf("%w: version %d, want %d", ErrInvalidReport, r.V, Version)
	case r.Gateway != id:
		return r, fmt.Errorf("%w: gateway %q on the subject of %q", ErrInvalidReport, truncate(r.Gateway), id)
	case r.Seq == 0:
		return r, fmt.Errorf("%w: no seq", ErrInvalidReport)
	}
	for name := range r.Services {
		if err := events.ValidateService(name); err != nil {
			return r, fmt.Errorf("%w: %w", ErrInvalidReport, err)
		}
	}
	return r, nil
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return "", false
	}
	return s[len(prefix):], true
}

func truncate(s string) string {
	if len(s) > 100 {
		return s[:100] + "..."
	}
	return s
}
