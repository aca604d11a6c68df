package serverlist_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

func TestInstanceLimits(t *testing.T) {
	t.Parallel()
	ok := inst("orders", "a", 1)
	ok.Metadata = map[string]string{"k": "v"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	many := inst("orders", "a", 1)
	many.Metadata = map[string]string{}
	for i := range serverlist.MaxMetadataEntries + 1 {
		many.Metadata[fmt.Sprint(i)] = "v"
	}
	long := inst("orders", "a", 1)
	long.Metadata = map[string]string{"k": strings.Repeat("v", serverlist.MaxMetadataValueLen+1)}
	host := inst("orders", "a", 1)
	host.Host = strings.Repeat("h", 256)
	for name, in := range map[string]serverlist.Instance{"too many labels": many, "a long value": long, "a long host": host} {
		if err := in.Validate(); !errors.Is(err, serverlist.ErrInvalidInstance) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// The bucket refuses values beyond MaxValueSize; a bucket made before the
// limit existed still cannot grow a gateway: the mirror skips and counts
// such values.
func TestOversizedValuesAreRefusedAndSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	big := []byte(`{"service":"orders","instanceId":"big","host":"h","port":1,"metadata":{"x":"` + strings.Repeat("x", serverlist.MaxValueSize) + `"}}`)
	key, _ := serverlist.EncodeKey("orders", "big")
	if _, err := e.reg.KeyValue().Put(t.Context(), key, big); err == nil {
		t.Fatal("the bucket took a value beyond MaxValueSize")
	}

	// An old bucket without the limit.
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	old, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: serverlist.BucketName("lb"), TTL: time.Minute, LimitMarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m := startMirror(t, reg, serverlist.MirrorConfig{})
	if _, err := old.Put(ctx, key, big); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the oversized value to be skipped", func() bool { return m.Stats().MalformedValues == 1 })
	if _, ok := m.Get("orders", "big"); ok {
		t.Fatal("the mirror holds an oversized value")
	}
	if _, err := reg.Register(ctx, func() serverlist.Instance {
		in := inst("orders", "big", 1)
		in.Metadata = map[string]string{}
		for i := range serverlist.MaxMetadataEntries {
			in.Metadata[fmt.Sprint(i)] = strings.Repeat("v", serverlist.MaxMetadataValueLen)
		}
		return in
	}()); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("Register of a record beyond MaxValueSize: %v", err)
	}
}
