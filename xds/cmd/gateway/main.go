// Command gateway is pushlb's gateway with an xDS control plane: the
// command of github.com/pushlb/pushlb/cmd/gateway, every flag the same,
// plus -xds ADDR, which serves the pushed lists over ADS to grpc-go's xDS
// clients (xds:///<service>) and Envoy. See docs/xds.md.
//
//	cd xds && go build -o ../bin/gateway-xds ./cmd/gateway && cd ..
//	bin/gateway-xds -demo -xds 127.0.0.1:18000
package main

import (
	"os"

	"github.com/pushlb/pushlb/internal/app/gateway"
	pushlbxds "github.com/pushlb/pushlb/xds"
)

func main() {
	os.Exit(gateway.Main(os.Args[1:], os.Stdout, os.Stderr, pushlbxds.Extension()))
}
