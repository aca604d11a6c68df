package events

import (
	"errors"
	"testing"
)

func TestSubjects(t *testing.T) {
	tests := []struct{ got, want string }{
		{Subject(DefaultPrefix, "orders", Online), "lb.svc.orders.online"},
		{Subject(DefaultPrefix, "orders", Offline), "lb.svc.orders.offline"},
		{Subject("prod.eu.lb", "billing-api_v2", Offline), "prod.eu.lb.svc.billing-api_v2.offline"},
		{WildcardSubject(DefaultPrefix), "lb.svc.>"},
		{WildcardSubject("prod.lb"), "prod.lb.svc.>"},
		{ServiceSubject(DefaultPrefix, "orders"), "lb.svc.orders.*"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestParseSubject(t *testing.T) {
	tests := []struct {
		prefix, subject string
		service         string
		kind            Kind
		err             error
	}{
		{"lb", "lb.svc.orders.online", "orders", Online, nil},
		{"lb", "lb.svc.orders.offline", "orders", Offline, nil},
		{"prod.lb", "prod.lb.svc.Billing-API_v2.online", "Billing-API_v2", Online, nil},
		{"lb", "lb.svc.orders", "", 0, ErrBadSubject},
		{"lb", "lb.svc.orders.", "", 0, ErrBadSubject},
		{"lb", "lb.svc.orders.restart", "", 0, ErrBadSubject},
		{"lb", "lb.svc.orders.online.extra", "", 0, ErrBadSubject},
		{"lb", "lb.svc.orders.eu.online", "", 0, ErrBadSubject},
		{"lb", "lb.svc..online", "", 0, ErrInvalidService}, // also ErrBadSubject, checked below
		{"lb", "lb.svc.*.online", "", 0, ErrInvalidService},
		{"lb", "lb.svc.>", "", 0, ErrBadSubject},
		{"lb", "lb.svc.orders.ONLINE", "", 0, ErrBadSubject},
		{"lb", "lbx.svc.orders.online", "", 0, ErrBadSubject},
		{"lb", "xlb.svc.orders.online", "", 0, ErrBadSubject},
		{"lb", "lb.svcx.orders.online", "", 0, ErrBadSubject},
		{"lb", "prod.lb.svc.orders.online", "", 0, ErrBadSubject},
		{"prod.lb", "lb.svc.orders.online", "", 0, ErrBadSubject},
		{"lb", "", "", 0, ErrBadSubject},
		{"", "lb.svc.orders.online", "", 0, ErrInvalidPrefix},
		{"lb.*", "lb.*.svc.orders.online", "", 0, ErrInvalidPrefix},
	}
	for _, tt := range tests {
		service, kind, err := ParseSubject(tt.prefix, tt.subject)
		if tt.err != nil {
			if !errors.Is(err, tt.err) {
				t.Errorf("ParseSubject(%q, %q) error = %v, want %v", tt.prefix, tt.subject, err, tt.err)
			}
			if errors.Is(tt.err, ErrInvalidService) && !errors.Is(err, ErrBadSubject) {
				t.Errorf("ParseSubject(%q, %q) error = %v, want ErrBadSubject too", tt.prefix, tt.subject, err)
			}
			continue
		}
		if err != nil || service != tt.service || kind != tt.kind {
			t.Errorf("ParseSubject(%q, %q) = %q, %v, %v; want %q, %v", tt.prefix, tt.subject, service, kind, err, tt.service, tt.kind)
		}
	}
}

func TestSubjectParseRoundTrip(t *testing.T) {
	for _, prefix := range []string{"lb", "a.b-c.d_e"} {
		for _, service := range []string{"orders", "x", "A-b_9"} {
			for _, k := range []Kind{Online, Offline} {
				s, got, err := ParseSubject(prefix, Subject(prefix, service, k))
				if err != nil || s != service || got != k {
					t.Errorf("ParseSubject(Subject(%q, %q, %v)) = %q, %v, %v", prefix, service, k, s, got, err)
				}
			}
		}
	}
}

func TestValidatePrefix(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"lb", true}, {"prod.lb", true}, {"a-b.c_d.9", true},
		{"", false}, {".", false}, {".lb", false}, {"lb.", false}, {"a..b", false},
		{"lb.*", false}, {"lb.>", false}, {"l b", false}, {"lb\n", false}, {"é", false},
	}
	for _, tt := range tests {
		err := ValidatePrefix(tt.in)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidPrefix)) {
			t.Errorf("ValidatePrefix(%q) = %v, want ok=%v", tt.in, err, tt.ok)
		}
	}
}
