package gateway

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb/internal/app/natsaccounts"
)

// embeddedStartTimeout bounds the wait for the embedded server to accept
// connections once its address and data directory were found usable.
const embeddedStartTimeout = 10 * time.Second

// embeddedNATS is the NATS server with JetStream that the gateway starts
// when no URL is configured, so one command works on a fresh machine.
type embeddedNATS struct {
	srv     *server.Server
	tempDir string   // removed on shutdown; empty when the user chose the directory
	policy  dataSync // when its JetStream writes are forced to disk
}

// startEmbeddedNATS checks that the data directory is writable, then
// starts the server and waits until it accepts connections or reports why
// it cannot (its own fatal error, such as JetStream's). The caller checked
// the address with checkListeners.
//
// dataSync is the dataSync setting (-data-sync): when JetStream forces its
// writes to disk, always or at most an interval after them (parseDataSync;
// "" for DefaultDataSync), set explicitly on the server.
//
// The server runs the accounts of natsaccounts.Config: every client
// (without credentials) lands in one application account with JetStream,
// and a system account publishes the account's client-disconnect
// advisories, imported to the prefix's advisory subject, so that crash
// detection in milliseconds needs no set-up.
func startEmbeddedNATS(addr, dataDir, dataSync, prefix string, log zerolog.Logger) (*embeddedNATS, error) {
	policy, err := parseDataSync(dataSync)
	if err != nil {
		return nil, fmt.Errorf("%w: dataSync: %w", ErrConfig, err)
	}
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
	e := &embeddedNATS{policy: policy}
	if dataDir == "" {
		if dataSync != "" {
			log.Warn().Str("dataSync", policy.String()).
				Msg("dataSync without dataDir: the embedded server's store is a temporary directory removed at exit, so no sync policy keeps the registry across a restart")
		}
		if dataDir, err = os.MkdirTemp("", "pushlb-nats-"); err != nil {
			return nil, fmt.Errorf("gateway: embedded NATS data dir: %w", err)
		}
		e.tempDir = dataDir
	} else if err := checkDataDir(dataDir); err != nil {
		return nil, err
	}
	opts, err := natsaccounts.Options(prefix)
	if err != nil {
		e.cleanup()
		return nil, fmt.Errorf("gateway: embedded NATS: %w", err)
	}
	opts.ServerName = "pushlb-embedded"
	opts.Host, opts.Port = host, port
	opts.JetStream, opts.StoreDir = true, dataDir
	policy.apply(opts)
	opts.NoSigs, opts.NoLog = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		e.cleanup()
		return nil, fmt.Errorf("gateway: embedded NATS: %w", err)
	}
	sl := &startLogger{log: log, fatal: make(chan string, 1)}
	srv.SetLoggerV2(sl, false, false, false)
	go srv.Start()
	deadline := time.Now().Add(embeddedStartTimeout)
	for !srv.ReadyForConnections(100 * time.Millisecond) {
		var err error
		select {
		case msg := <-sl.fatal:
			err = fmt.Errorf("gateway: embedded NATS on %s (data in %s): %s", addr, dataDir, msg)
		default:
			if time.Now().After(deadline) {
				err = fmt.Errorf("gateway: embedded NATS on %s: not accepting connections after %v", addr, embeddedStartTimeout)
			}
		}
		if err != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
			e.cleanup()
			return nil, err
		}
	}
	e.srv = srv
	return e, nil
}

// checkDataDir creates the embedded server's data directory if needed and
// writes a file in it, so that a directory the gateway cannot use is
// reported with the system's error before the server starts.
func checkDataDir(dir string) error {
	fail := func(err error) error {
		return fmt.Errorf("gateway: embedded NATS data directory (-data-dir) %s is not usable: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fail(err)
	}
	f, err := os.CreateTemp(dir, ".pushlb-write-check-*")
	if err != nil {
		return fail(err)
	}
	_, err = f.WriteString("pushlb\n")
	err = errors.Join(err, f.Sync(), f.Close())
	os.Remove(f.Name())
	if err != nil {
		return fail(err)
	}
	return nil
}

// listenCheck is an address the gateway is about to listen on, and the
// flag that sets it.
type listenCheck struct{ addr, flag string }

// checkListeners binds each address and releases it at once, so that an
// address in use (a second gateway on the same ports) is reported with the
// system's own error, for all of them at once, before anything starts.
func checkListeners(checks ...listenCheck) error {
	errs := &listenErrors{}
	for _, c := range checks {
		ln, err := net.Listen("tcp", c.addr)
		if err != nil {
			errs.append(fmt.Errorf("%s %s: %w", c.flag, c.addr, err))
			errs.natsInUse = errs.natsInUse || c.flag == "-embedded-nats" && errors.Is(err, syscall.EADDRINUSE)
			continue
		}
		ln.Close()
	}
	if len(errs.errs) == 0 {
		return nil
	}
	return errs
}

// listenErrors is the failures of checkListeners, said on one line.
type listenErrors struct {
	errs      []error
	natsInUse bool // the embedded server's address is in use
}

func (e *listenErrors) append(err error) { e.errs = append(e.errs, err) }

func (e *listenErrors) Error() string {
	parts := make([]string, len(e.errs))
	inUse := false
	for i, err := range e.errs {
		parts[i] = err.Error()
		inUse = inUse || errors.Is(err, syscall.EADDRINUSE)
	}
	msg := "gateway: cannot listen: " + strings.Join(parts, "; ")
	if inUse {
		msg += " (another process, perhaps another gateway, holds it: stop it or choose other addresses"
		if e.natsInUse {
			msg += "; to use that NATS server instead of starting one, pass -nats nats://ADDRESS"
		}
		msg += ")"
	}
	return msg
}

func (e *listenErrors) Unwrap() []error { return e.errs }

// startLogger takes the embedded server's log: a fatal error (it cannot
// listen, JetStream cannot start) ends the start with that error; the
// rest goes to the gateway's log at debug level.
type startLogger struct {
	log   zerolog.Logger
	fatal chan string
}

func (l *startLogger) Fatalf(format string, v ...any) {
	select {
	case l.fatal <- fmt.Sprintf(format, v...):
	default:
	}
}

func (l *startLogger) Errorf(format string, v ...any) {
	l.log.Debug().Msgf("embedded NATS: error: "+format, v...)
}

func (l *startLogger) Warnf(format string, v ...any) {
	l.log.Debug().Msgf("embedded NATS: warning: "+format, v...)
}

func (l *startLogger) Noticef(string, ...any) {}
func (l *startLogger) Debugf(string, ...any)  {}
func (l *startLogger) Tracef(string, ...any)  {}

var _ server.Logger = (*startLogger)(nil)

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
