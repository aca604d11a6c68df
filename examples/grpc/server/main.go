// Command server is the gRPC server of the example: the standard health
// service on -listen. It knows nothing of pushlb: announce registers it.
//
//	announce -service greeter -addr 127.0.0.1:50051 -- server -listen 127.0.0.1:50051
package main

import (
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:50051", "`address` to serve gRPC on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() {
		// announce forwards SIGTERM after it has withdrawn the instance
		// and waited its drain: finish the RPCs in flight, then stop.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		s.GracefulStop()
	}()
	log.Printf("serving gRPC on %s", ln.Addr())
	if err := s.Serve(ln); err != nil {
		log.Fatal(err)
	}
}
