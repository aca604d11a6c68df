// Command client calls a service by name with a plain http.Client whose
// Transport is pushlb's: each request goes to one live instance of the
// service, picked by its balancer, with no gateway in between.
//
//	go run ./examples/embed/client -nats nats://127.0.0.1:4222 -n 6 http://hello/x
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb"
)

func main() {
	natsURL := flag.String("nats", nats.DefaultURL, "NATS server URL")
	n := flag.Int("n", 6, "requests to send")
	flag.Parse()
	url := flag.Arg(0) // http://<service>/<path>

	nc, err := nats.Connect(*natsURL, pushlb.PingOptions()...) // pings that notice a paused server within the lease
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := pushlb.New(nc, pushlb.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	client := &http.Client{Transport: c.Transport(), Timeout: 5 * time.Second}
	for range *n {
		resp, err := client.Get(url)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// One line per answer: the body's own line end is not doubled.
		fmt.Printf("%d %s\n", resp.StatusCode, bytes.TrimRight(body, "\r\n"))
	}
}
