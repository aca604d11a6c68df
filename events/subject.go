package events

import (
	"fmt"
	"strings"
)

// DefaultPrefix is the first token of pushlb's subjects unless configured
// otherwise.
const DefaultPrefix = "lb"

// svcToken separates the prefix from the service in every subject.
const svcToken = ".svc."

// Subject returns the subject an event of kind k for service is published
// on: "<prefix>.svc.<service>.online" or "...offline". It does not validate;
// with a valid prefix, a valid service and k Online or Offline the result is
// a valid subject. EncodeMessage validates and calls it.
func Subject(prefix, service string, k Kind) string {
	return prefix + svcToken + service + "." + k.String()
}

// WildcardSubject returns "<prefix>.svc.>", which matches the events of
// every service.
func WildcardSubject(prefix string) string {
	return prefix + svcToken + ">"
}

// ServiceSubject returns "<prefix>.svc.<service>.*", which matches both
// kinds of events of one service.
func ServiceSubject(prefix, service string) string {
	return prefix + svcToken + service + ".*"
}

// ParseSubject splits an event subject under prefix into its service and
// kind. A subject of any other shape (another prefix, a missing or extra
// token, an invalid service name, a last token other than "online" or
// "offline") fails with ErrBadSubject; an invalid prefix with
// ErrInvalidPrefix.
func ParseSubject(prefix, subject string) (service string, k Kind, err error) {
	if err := ValidatePrefix(prefix); err != nil {
		return "", 0, err
	}
	rest, ok := strings.CutPrefix(subject, prefix+svcToken)
	if !ok {
		return "", 0, fmt.Errorf("%w: %q does not start with %q", ErrBadSubject, subject, prefix+svcToken)
	}
	service, kind, ok := strings.Cut(rest, ".")
	if !ok {
		return "", 0, fmt.Errorf("%w: %q: want <prefix>.svc.<service>.<online|offline>", ErrBadSubject, subject)
	}
	if err := ValidateService(service); err != nil {
		return "", 0, fmt.Errorf("%w: %q: %w", ErrBadSubject, subject, err)
	}
	switch kind {
	case "online":
		k = Online
	case "offline":
		k = Offline
	default:
		return "", 0, fmt.Errorf("%w: %q: last token %q is neither online nor offline", ErrBadSubject, subject, kind)
	}
	return service, k, nil
}

// DisconnectAdvisorySubject returns "<prefix>.advisory.disconnect": the
// subject to which a deployment imports the NATS server's client-disconnect
// advisories of its account ($SYS.ACCOUNT.<account>.DISCONNECT, published
// in the system account), and on which gateways follow them to detect
// crashes (docs/protocol.md, "Crash detection"). No client publishes on
// it: the deployment's permissions deny it to every user.
func DisconnectAdvisorySubject(prefix string) string {
	return prefix + ".advisory.disconnect"
}

// AnnouncerName is the NATS connection name of a process that announces
// the instance service/id (announce's): "announce <service> <id>". A
// client-disconnect advisory carries it, which lets the gateways' reaper
// find the record of a crashed instance whose service it does not follow
// (docs/protocol.md, "Crash detection"). Other publishers may use it too.
func AnnouncerName(service, id string) string { return "announce " + service + " " + id }

// ParseAnnouncerName returns the service and instance ID that name, an
// AnnouncerName, names; ok false for any other name or an invalid service
// or ID.
func ParseAnnouncerName(name string) (service, id string, ok bool) {
	rest, ok := strings.CutPrefix(name, "announce ")
	if !ok {
		return "", "", false
	}
	service, id, ok = strings.Cut(rest, " ")
	if !ok || ValidateService(service) != nil || ValidateInstanceID(id) != nil {
		return "", "", false
	}
	return service, id, true
}
