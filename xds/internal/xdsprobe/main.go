// Command xdsprobe is a grpc-go xDS client for the tests: it dials -target
// (xds:///orders) with the bootstrap of the environment
// (GRPC_XDS_BOOTSTRAP_CONFIG or GRPC_XDS_BOOTSTRAP), calls the standard
// health service's Check over and over until SIGINT or SIGTERM, and prints
// a line whenever the set of servers that answered the last -window calls
// changes ("peers 127.0.0.1:4001,127.0.0.1:4002"), and whenever the error
// of a failed call differs from the one before ("error: ..."). It paces
// its calls (-every), as a client under steady load does.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and the xDS balancers
)

func main() {
	target := flag.String("target", "xds:///orders", "gRPC `target`")
	window := flag.Int("window", 20, "the last `n` calls whose servers are printed")
	every := flag.Duration("every", 2*time.Millisecond, "time between two calls")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdsprobe:", err)
		os.Exit(2)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	var (
		last      []string // servers of the last calls, oldest first
		printed   string
		lastError string
	)
	tick := time.NewTicker(*every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var p peer.Peer
		_, err := health.Check(callCtx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if msg := err.Error(); msg != lastError {
				fmt.Println("error:", msg)
				lastError = msg
			}
			continue
		}
		lastError = ""
		last = append(last, p.Addr.String())
		if len(last) > *window {
			last = last[1:]
		}
		set := slices.Clone(last)
		slices.Sort(set)
		if line := "peers " + strings.Join(slices.Compact(set), ","); line != printed {
			fmt.Println(line)
			printed = line
		}
	}
}
