// Command gateway is a gateway of one's own in forty lines: pushlb's push
// path over an existing NATS connection, serving /<service>/<rest> from the
// instances that announced themselves (cmd/announce, or any publisher).
//
//	go run ./examples/embed/gateway -nats nats://127.0.0.1:4222 -listen 127.0.0.1:8090
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb"
)

func main() {
	natsURL := flag.String("nats", nats.DefaultURL, "NATS server URL")
	listen := flag.String("listen", "127.0.0.1:8090", "proxy address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	nc, err := nats.Connect(*natsURL, pushlb.PingOptions()...) // pings that notice a paused server within the lease
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := pushlb.New(nc, pushlb.Config{Zone: os.Getenv("ZONE")})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	srv := &http.Server{Addr: *listen, Handler: c.Handler()}
	go func() { <-ctx.Done(); srv.Shutdown(context.Background()) }()
	// The client follows each service from the first request for it.
	log.Printf("serving on %s", *listen)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
