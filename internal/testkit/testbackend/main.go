// Command testbackend is a tiny HTTP server for the tests of pushlb's
// binaries: a stand-in for a real service that announce supervises and
// gateways route to.
//
//	testbackend -addr 127.0.0.1:PORT -name NAME [-delay D] [-exit-after D]
//	            [-exit-on-sigterm-after D] [-exit-code N]
//
// Every request is answered with 200 and the body "NAME PATH\n"; GET /health
// answers 200 "ok\n". The response header X-Backend carries NAME too.
//
// Flags:
//
//	-addr ADDR                  listen address (required)
//	-name NAME                  name to answer with (default "backend")
//	-delay D                    wait D before listening, to play a slow start
//	-exit-after D               shut down on its own after serving for D
//	-exit-on-sigterm-after D    on SIGTERM or SIGINT, keep serving for D
//	                            before shutting down
//	-exit-code N                exit status after a shutdown (default 0)
//
// It prints one line per life event on stdout, which tests read to learn
// the order of things. Each is printed once SIGTERM and SIGINT are handled,
// so a test may signal the process as soon as it read any of them:
//
//	testbackend NAME waiting D before listening   (with -delay)
//	testbackend NAME listening on ADDR
//	testbackend NAME received SIGNAL
//	testbackend NAME exiting with N
//
// A shutdown is graceful: requests in flight finish (for at most 5 s). A
// listen error exits with status 1, a usage error with status 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// shutdownTimeout bounds how long in-flight requests may take to finish.
const shutdownTimeout = 5 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("testbackend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "listen `address` (required)")
	name := fs.String("name", "backend", "`name` to answer with")
	delay := fs.Duration("delay", 0, "wait this long before listening")
	exitAfter := fs.Duration("exit-after", 0, "shut down on its own after serving this long (0: never)")
	sigtermAfter := fs.Duration("exit-on-sigterm-after", 0, "on SIGTERM or SIGINT, keep serving this long before shutting down")
	exitCode := fs.Int("exit-code", 0, "exit status after a shutdown")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *addr == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "testbackend: -addr is required and no arguments are accepted")
		return 2
	}

	// Listen for signals from the start, so that one sent during -delay is
	// not lost and does not kill the process before it reports it.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	say := func(format string, a ...any) {
		fmt.Fprintf(stdout, "testbackend %s "+format+"\n", append([]any{*name}, a...)...)
	}

	if *delay > 0 {
		say("waiting %v before listening", *delay)
		select {
		case <-time.After(*delay):
		case s := <-sigs:
			say("received %v", s)
			say("exiting with %d", *exitCode)
			return *exitCode
		}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "testbackend %s: %v\n", *name, err)
		return 1
	}
	srv := &http.Server{Handler: handler(*name), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	say("listening on %s", ln.Addr())

	var timeout <-chan time.Time
	if *exitAfter > 0 {
		timeout = time.After(*exitAfter)
	}
	select {
	case s := <-sigs:
		say("received %v", s)
		time.Sleep(*sigtermAfter)
	case <-timeout:
	case err := <-served:
		fmt.Fprintf(stderr, "testbackend %s: %v\n", *name, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		fmt.Fprintf(stderr, "testbackend %s: shutdown: %v\n", *name, err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "testbackend %s: %v\n", *name, err)
	}
	say("exiting with %d", *exitCode)
	return *exitCode
}

// handler answers /health with "ok" and everything else with the name and
// the path.
func handler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Backend", name)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if r.URL.Path == "/health" {
			fmt.Fprintln(w, "ok")
			return
		}
		fmt.Fprintf(w, "%s %s\n", name, r.URL.Path)
	})
}
