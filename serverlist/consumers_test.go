package serverlist_test

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// TestBucketAllowsAConsumerPerFollow: the bucket Open creates allows
// BucketMaxConsumers consumers, not the server's default of 1,000 per
// stream, which 100 gateways following 10 services each reach. On a
// stream that allows fewer than a scoped mirror needs, the mirror says
// so and why; once the limit is raised, it follows every service.
func TestBucketAllowsAConsumerPerFollow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	stream := "KV_" + serverlist.BucketName(events.DefaultPrefix)
	st, err := e.js.Stream(testCtx(t, 5*time.Second), stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxConsumers != serverlist.BucketMaxConsumers {
		t.Fatalf("the new bucket's stream allows %d consumers, want %d", cfg.MaxConsumers, serverlist.BucketMaxConsumers)
	}
	register(t, e.reg, inst("orders", "a1", 1), inst("billing", "b1", 2), inst("stock", "s1", 3))

	// A stream that allows two consumers: the mirror's third follow is
	// refused by the server.
	cfg.MaxConsumers = 2
	if _, err := e.js.UpdateStream(testCtx(t, 5*time.Second), cfg); err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	m := startMirror(t, e.reg, serverlist.MirrorConfig{Scoped: true, RetryBackoff: 10 * time.Millisecond, Logger: zerolog.New(&logs)})
	follow(t, m, "orders")
	follow(t, m, "billing")
	done := make(chan error, 1)
	go func() { done <- m.Follow(testCtx(t, 20*time.Second), "stock") }()
	testutil.Eventually(t, "the mirror to explain the refusal", func() bool {
		return strings.Contains(logs.String(), "allows no more consumers")
	})

	cfg.MaxConsumers = serverlist.BucketMaxConsumers
	if _, err := e.js.UpdateStream(testCtx(t, 5*time.Second), cfg); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Follow(stock) once the limit is raised: %v", err)
	}
	for _, s := range []string{"orders", "billing", "stock"} {
		if len(m.Service(s)) != 1 {
			t.Fatalf("Service(%s) = %v after the limit was raised", s, m.Service(s))
		}
	}
}
