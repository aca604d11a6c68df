// Command service is a service instance that announces itself with the
// publisher API, as a Go program does without the announce binary: it
// serves HTTP, claims its instance ID in the registry, publishes itself
// online, keeps its lease (and, with -gossip, a gossip node that tells the
// gateways of a crash within a second), and on SIGINT/SIGTERM withdraws
// before it stops serving.
//
//	go run ./examples/embed/service -nats nats://127.0.0.1:4222 -service hello -listen 127.0.0.1:9001
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/gossip"
	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

func main() {
	natsURL := flag.String("nats", nats.DefaultURL, "NATS server URL")
	service := flag.String("service", "hello", "service name")
	listen := flag.String("listen", "127.0.0.1:9001", "HTTP address, host:port (the address announced)")
	zone := flag.String("zone", "", "zone of this instance")
	join := flag.String("gossip", "", "a gateway's gossip address to join (host:port); empty: no gossip, a crash is found by the lease")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Serve first: an instance is announced once it answers.
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	host, portStr, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portStr)
	id := fmt.Sprintf("%s:%s:%d", host, *service, port) // Eureka's host:service:port
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", id, r.URL.Path)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)

	nc, err := nats.Connect(*natsURL, publisher.PingOptions()...) // pings that notice a paused server within the lease
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// The registry: the bucket's lease is the deployment's (the zero
	// config takes it, or creates the bucket with 30 s).
	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{})
	if err != nil {
		log.Fatal(err)
	}
	cfg := publisher.Config{
		OnClaimWait: func(held serverlist.Instance, wait time.Duration) {
			log.Printf("%s is held by a previous process's record (a crash?): waiting up to %v for it to prove alive", id, wait)
		},
	}
	if *join != "" {
		cfg.Gossip = &gossip.Config{Join: []string{*join}} // a free port on the address that reaches the gateway
	}
	pub, err := publisher.New(nc, reg, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	in := serverlist.Instance{Service: *service, InstanceID: id, Host: host, Port: port, Zone: *zone}
	if err := pub.Announce(ctx, in); err != nil { // claims the ID, publishes online, starts the lease
		log.Fatal(err)
	}
	log.Printf("announced %s (%s)", id, ln.Addr())

	<-ctx.Done()
	// Withdraw first, so the gateways stop sending, then drain and stop.
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := pub.Withdraw(wctx, "shutdown"); err != nil && !errors.Is(err, publisher.ErrReplaced) {
		log.Printf("withdraw: %v", err)
	}
	log.Printf("withdrawn %s", id)
	srv.Shutdown(wctx)
}
