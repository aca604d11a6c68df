// Command balance is a runnable tour of pushlb's balancer core: it starts
// local HTTP backends in two zones, balances requests over them with the
// default rule (ZoneAvoidance) and zone preference, then shows a backend
// that refuses connections being skipped by the circuit breaker, a forced
// zone, and a list change.
//
//	go run ./examples/balance
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pushlb/pushlb/balancer"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "balance:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	var list []balancer.Server
	for i, zone := range []string{"a", "a", "b", "b"} {
		srv, err := backend(fmt.Sprintf("backend-%d", i))
		if err != nil {
			return err
		}
		defer srv.Close()
		host, port, _ := net.SplitHostPort(srv.Addr)
		p, _ := strconv.Atoi(port)
		list = append(list, balancer.Server{ID: fmt.Sprintf("backend-%d", i), Host: host, Port: p, Zone: zone})
	}

	cfg := balancer.DefaultConfig()
	cfg.Zone = "a" // the client's zone: ZonePreference keeps zone a while it has servers
	b, err := balancer.New("demo", cfg)
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.SetServers(list); err != nil {
		return err
	}
	client := &http.Client{Timeout: time.Second}

	fmt.Println("1. 100 requests, client in zone a (Spring's zone preference):")
	show(send(ctx, b, client, 100))

	fmt.Println("2. backend-1 stops accepting connections; its breaker opens after 3 failures:")
	if err := b.SetServers(append(list[:1:1], append([]balancer.Server{{ID: "backend-1", Host: "127.0.0.1", Port: closedPort(), Zone: "a"}}, list[2:]...)...)); err != nil {
		return err
	}
	show(send(ctx, b, client, 100))

	fmt.Println("3. forcing zone b for these calls with balancer.WithZone:")
	show(send(balancer.WithZone(ctx, "b"), b, client, 100))

	fmt.Println("4. zone a leaves the list (as a push update would do): zone b takes over:")
	if err := b.SetServers(list[2:]); err != nil {
		return err
	}
	show(send(ctx, b, client, 100))
	return nil
}

// send makes n requests through the balancer, reporting each outcome
// through its Pick as the HTTP layer (lbhttp) does, and counts answers per
// backend.
func send(ctx context.Context, b *balancer.Balancer, client *http.Client, n int) map[string]int {
	counts := map[string]int{}
	for range n {
		p, err := b.Pick(ctx)
		if err != nil {
			counts["error: "+err.Error()]++
			continue
		}
		resp, err := client.Get("http://" + p.Server.Addr() + "/")
		if err != nil {
			var op *net.OpError
			p.Done(balancer.DoneInfo{Err: err, ConnectFailure: errors.As(err, &op) && op.Op == "dial"})
			counts["failed on "+p.Server.ID]++
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		p.Done(balancer.DoneInfo{}) // the response time is the time since the pick
		counts[strings.TrimSpace(string(body))]++
	}
	return counts
}

func show(counts map[string]int) {
	names := make([]string, 0, len(counts))
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Printf("   %-28s %3d\n", k, counts[k])
	}
}

func backend(name string) (*http.Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Addr: ln.Addr().String(), Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, name)
	})}
	go srv.Serve(ln)
	return srv, nil
}

// closedPort returns a local port with nothing listening.
func closedPort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 1
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}
