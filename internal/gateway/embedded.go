package gateway

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// embeddedNATS is the NATS server with JetStream that the gateway starts
// when no URL is configured, so one command works on a fresh machine.
type embeddedNATS struct {
	srv     *server.Server
	tempDir string // removed on shutdown; empty when the user chose the directory
}

func startEmbeddedNATS(addr, dataDir string) (*embeddedNATS, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: embedded NATS address %q: %w", ErrConfig, addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("%w: embedded NATS port %q", ErrConfig, portStr)
	}
	if port == 0 {
		port = server.RANDOM_PORT // nats-server reads 0 as its default, 4222
	}
	e := &embeddedNATS{}
	if dataDir == "" {
		if dataDir, err = os.MkdirTemp("", "pushlb-nats-"); err != nil {
			return nil, fmt.Errorf("gateway: embedded NATS data dir: %w", err)
		}
		e.tempDir = dataDir
	}
	srv, err := server.NewServer(&server.Options{
		ServerName: "pushlb-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dataDir,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		e.cleanup()
		return nil, fmt.Errorf("gateway: embedded NATS: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		e.cleanup()
		return nil, fmt.Errorf("gateway: embedded NATS did not start on %s (is the port in use? set -embedded-nats or -nats)", addr)
	}
	e.srv = srv
	return e, nil
}

// URL is the client URL of the embedded server.
func (e *embeddedNATS) URL() string { return e.srv.ClientURL() }

func (e *embeddedNATS) shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.cleanup()
}

func (e *embeddedNATS) cleanup() {
	if e.tempDir != "" {
		os.RemoveAll(e.tempDir)
	}
}
