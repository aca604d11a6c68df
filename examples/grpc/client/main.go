// Command client calls a service over gRPC by its pushlb name: the
// pushlb resolver hands grpc-go the instances the moment they announce
// themselves or leave, and the pushlb balancer picks among them with
// pushlb's rules and zones. It prints the address of the server that
// answered each RPC.
//
//	go run ./client -nats nats://127.0.0.1:4222 -zone a -n 6 greeter
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/pushlb/pushlb"
	pushlbgrpc "github.com/pushlb/pushlb/grpc"
)

// serviceConfig names the pushlb balancer (ZoneAvoidance, the client's
// zone preferred) and retries RPCs that found no server.
const serviceConfig = `{
  "loadBalancingConfig": [{"pushlb": {"rule": "ZoneAvoidance"}}],
  "methodConfig": [{
    "name": [{}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
  }]
}`

func main() {
	natsURL := flag.String("nats", nats.DefaultURL, "NATS server `URL`")
	zone := flag.String("zone", "", "this client's `zone`, preferred by the balancer")
	n := flag.Int("n", 6, "RPCs to make")
	flag.Parse()
	service := flag.Arg(0)
	pushlbgrpc.RegisterBalancer()

	nc, err := nats.Connect(*natsURL, pushlb.PingOptions()...) // pings that notice a paused server within the lease
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := pushlb.New(nc, pushlb.Config{Zone: *zone})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil { // returns once the registry is loaded
		log.Fatal(err)
	}
	defer c.Close()

	conn, err := grpc.NewClient("pushlb:///"+service,
		grpc.WithResolvers(pushlbgrpc.NewBuilder(c)),
		grpc.WithDefaultServiceConfig(serviceConfig),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	for range *n {
		var p peer.Peer
		if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
			log.Fatal(err)
		}
		fmt.Println("answered by", p.Addr)
	}
}
