package gateway

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// startErr starts a gateway that must fail, and returns its error. The
// failure must be its cause, said at once: not the end of the wait for the
// embedded server (embeddedStartTimeout) or of the start's context.
func startErr(t *testing.T, cfg Config) error {
	t.Helper()
	g, err := New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	began := time.Now()
	err = g.Start(ctx)
	if err == nil {
		g.Shutdown(context.Background())
		t.Fatal("the gateway started")
	}
	t.Logf("Start failed after %v", time.Since(began))
	if strings.Contains(err.Error(), "not accepting connections after") || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start waited out a timeout: %v", err)
	}
	return err
}

// A second gateway on the same ports names every address in use and the
// system's error at once, instead of waiting 10 s and guessing.
func TestSecondGatewaySaysWhichAddressIsInUse(t *testing.T) {
	first := startGateway(t, testConfig(t))
	u, err := url.Parse(first.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.EmbeddedNATS, cfg.Listen, cfg.Admin = u.Host, first.ProxyAddr(), first.AdminAddr()
	err = startErr(t, cfg)
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("error %v, want EADDRINUSE", err)
	}
	msg := err.Error()
	for _, want := range []string{"-embedded-nats " + u.Host, "-listen " + first.ProxyAddr(), "-admin " + first.AdminAddr(), "address already in use", "-nats"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "?") {
		t.Errorf("the error guesses: %s", msg)
	}
	// With -nats, the embedded address is not used, and only the HTTP
	// listeners are in the way.
	cfg.NATS.URL = first.NATSURL()
	err = startErr(t, cfg)
	if msg := err.Error(); strings.Contains(msg, "-embedded-nats") || strings.Contains(msg, "-nats") || !strings.Contains(msg, "-listen "+first.ProxyAddr()) {
		t.Errorf("with -nats: %s", msg)
	}
}

// A data directory the gateway cannot write says why at once.
func TestUnusableDataDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.DataDir = filepath.Join(file, "nats")
	err := startErr(t, cfg)
	if !errors.Is(err, syscall.ENOTDIR) || !strings.Contains(err.Error(), "-data-dir") || !strings.Contains(err.Error(), cfg.DataDir) {
		t.Fatalf("error %v, want ENOTDIR naming -data-dir and %s", err, cfg.DataDir)
	}
}

// The embedded server's own startup error reaches the caller: here
// JetStream cannot make its store, a file where its directory goes.
func TestEmbeddedServerErrorSurfaces(t *testing.T) {
	cfg := testConfig(t)
	if err := os.WriteFile(filepath.Join(cfg.DataDir, "jetstream"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := startErr(t, cfg)
	if msg := err.Error(); !strings.Contains(msg, "JetStream") || strings.Contains(msg, "?") {
		t.Fatalf("error %v, want JetStream's own", err)
	}
}
