// Command testserver is a gRPC server for the tests of package pushlbgrpc
// that need a real process (a SIGKILL): it serves the standard health
// service on -listen and prints "listening ADDR" once it does.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "`address` to serve on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testserver:", err)
		os.Exit(1)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	fmt.Println("listening", ln.Addr())
	if err := s.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "testserver:", err)
		os.Exit(1)
	}
}
