// Command caddy is caddy built from its Go module with its standard modules,
// as xcaddy would build it, for gateway.sh to compare its reverse_proxy with
// pushlb's gateway and nginx.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

func main() {
	caddycmd.Main()
}
