// Command caddy is Caddy with its standard modules and pushlb's: the
// dynamic upstream source "pushlb" and the selection policy "pushlb" of
// reverse_proxy. It is Caddy's documented main.go (what xcaddy generates)
// with one more import.
//
//	go build -o caddy ./cmd/caddy     # in the caddy/ module
//	./caddy list-modules | grep pushlb
//	./caddy run --config Caddyfile
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/pushlb/pushlb/caddy"
)

func main() {
	caddycmd.Main()
}
