package serverlist_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/serverlist"
)

func TestInstanceValidate(t *testing.T) {
	t.Parallel()
	good := inst("orders", "10.0.0.1:orders:9001", 9001)
	tests := []struct {
		name   string
		mutate func(*serverlist.Instance)
		ok     bool
	}{
		{"good", func(*serverlist.Instance) {}, true},
		{"service with dash and underscore", func(in *serverlist.Instance) { in.Service = "Order_svc-2" }, true},
		{"service max length", func(in *serverlist.Instance) { in.Service = strings.Repeat("s", 128) }, true},
		{"service too long", func(in *serverlist.Instance) { in.Service = strings.Repeat("s", 129) }, false},
		{"empty service", func(in *serverlist.Instance) { in.Service = "" }, false},
		{"service with dot", func(in *serverlist.Instance) { in.Service = "a.b" }, false},
		{"service with wildcard", func(in *serverlist.Instance) { in.Service = "a*" }, false},
		{"service with space", func(in *serverlist.Instance) { in.Service = "a b" }, false},
		{"id unicode and punctuation", func(in *serverlist.Instance) { in.InstanceID = "héllo wörld/1.2:3 ✓" }, true},
		{"id max length", func(in *serverlist.Instance) { in.InstanceID = strings.Repeat("i", 256) }, true},
		{"id too long", func(in *serverlist.Instance) { in.InstanceID = strings.Repeat("i", 257) }, false},
		{"empty id", func(in *serverlist.Instance) { in.InstanceID = "" }, false},
		{"id invalid utf-8", func(in *serverlist.Instance) { in.InstanceID = "a\xffb" }, false},
		{"id with newline", func(in *serverlist.Instance) { in.InstanceID = "a\nb" }, false},
		{"id with NUL", func(in *serverlist.Instance) { in.InstanceID = "a\x00b" }, false},
		{"id with C1 control", func(in *serverlist.Instance) { in.InstanceID = "a\u0085b" }, false},
		{"empty host", func(in *serverlist.Instance) { in.Host = "" }, false},
		{"port 0", func(in *serverlist.Instance) { in.Port = 0 }, false},
		{"port 65535", func(in *serverlist.Instance) { in.Port = 65535 }, true},
		{"port 65536", func(in *serverlist.Instance) { in.Port = 65536 }, false},
		{"negative port", func(in *serverlist.Instance) { in.Port = -1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := good.Clone()
			tt.mutate(&in)
			err := in.Validate()
			if tt.ok && err != nil {
				t.Fatalf("Validate() = %v, want nil", err)
			}
			if !tt.ok && !errors.Is(err, serverlist.ErrInvalidInstance) {
				t.Fatalf("Validate() = %v, want ErrInvalidInstance", err)
			}
		})
	}
}

func TestInstanceJSON(t *testing.T) {
	t.Parallel()
	in := inst("orders", "h:orders:9001", 9001)
	in.Secure = true
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"service", "instanceId", "host", "port", "secure", "zone", "metadata", "incarnation"} {
		if _, ok := fields[name]; !ok {
			t.Errorf("JSON lacks %q: %s", name, b)
		}
	}
	var back serverlist.Instance
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Equal(in) {
		t.Fatalf("round trip: got %+v, want %+v", back, in)
	}
	// Unknown fields are ignored (wire protocol).
	if err := json.Unmarshal([]byte(`{"service":"s","instanceId":"i","host":"h","port":1,"incarnation":2,"future":true}`), &back); err != nil {
		t.Fatalf("unknown field: %v", err)
	}
}

func TestInstanceCloneAndEqual(t *testing.T) {
	t.Parallel()
	a := inst("s", "i", 1)
	b := a.Clone()
	if !a.Equal(b) {
		t.Fatal("clone not equal")
	}
	b.Metadata["version"] = "2"
	if a.Metadata["version"] != "1" {
		t.Fatal("clone shares metadata")
	}
	if a.Equal(b) {
		t.Fatal("different metadata reported equal")
	}
	a.Metadata, b.Metadata = nil, map[string]string{}
	if !a.Equal(b) {
		t.Fatal("nil and empty metadata should be equal")
	}
	if got := inst("s", "i", 8080).Addr(); got != "127.0.0.1:8080" {
		t.Fatalf("Addr() = %q", got)
	}
	v6 := inst("s", "i", 80)
	v6.Host = "::1"
	if got := v6.Addr(); got != "[::1]:80" {
		t.Fatalf("Addr() = %q", got)
	}
}
