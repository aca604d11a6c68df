// Command fleet serves and announces a fleet of HTTP instances of one
// service from one process, for caddy.sh: N listeners on consecutive
// ports, each registered and announced through pushlb's publisher (one
// NATS connection), each answering every request with 200 "ok".
//
//	fleet -nats nats://127.0.0.1:4222 -service big -n 1000 -port 20000
//
// It prints "ready N" once every instance is announced, and on SIGINT or
// SIGTERM withdraws them all and exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/publisher"
	"github.com/pushlb/pushlb/serverlist"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

func run() error {
	url := flag.String("nats", "nats://127.0.0.1:4222", "NATS `URL`")
	service := flag.String("service", "fleet", "service `name`")
	n := flag.Int("n", 10, "number of instances")
	port := flag.Int("port", 20000, "first `port`; the instances listen on port .. port+n-1 of 127.0.0.1")
	zone := flag.String("zone", "", "the instances' `zone`")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, err := nats.Connect(*url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{})
	if err != nil {
		return err
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	var pubs []*publisher.Publisher
	defer func() {
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, p := range pubs {
			p.Withdraw(wctx, "fleet stopped")
			p.Close()
		}
	}()
	for i := range *n {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *port+i))
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: ok}
		go srv.Serve(ln)
		defer srv.Close()
		p, err := publisher.New(nc, reg, publisher.Config{})
		if err != nil {
			return err
		}
		pubs = append(pubs, p)
		in := serverlist.Instance{Service: *service, InstanceID: fmt.Sprintf("%s-%d", *service, i), Host: "127.0.0.1", Port: *port + i, Zone: *zone}
		if err := p.Announce(ctx, in); err != nil {
			return fmt.Errorf("announce %s: %w", in.InstanceID, err)
		}
	}
	fmt.Println("ready", *n)
	<-ctx.Done()
	return nil
}
