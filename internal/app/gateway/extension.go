package gateway

import (
	"context"
	"flag"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb"
)

// Extension is a component that a build of the gateway runs beside the
// proxy over the same pushed lists: the xds module's ADS server (-xds) is
// one. The main module's gateway has none, so that it never links grpc-go;
// a build with extensions is a main package that calls Main with them
// (github.com/pushlb/pushlb/xds/cmd/gateway).
//
// An extension that is also a prometheus.Collector has its metrics on the
// gateway's /metrics, registered once it started.
//
// Threading: RegisterFlags is called before parsing, possibly several times
// on fresh flag sets (the command line is parsed twice, see Main); Start
// and Stop are called once each, from the goroutine that runs the gateway.
type Extension interface {
	// Name names the extension in logs and errors ("xds").
	Name() string
	// RegisterFlags adds the extension's flags to fs.
	RegisterFlags(fs *flag.FlagSet)
	// Start starts the extension over the gateway's client, which has
	// loaded the registry. It is called before the proxy listens; an error
	// stops the gateway's start-up. ctx bounds the start-up only.
	Start(ctx context.Context, c *pushlb.Client, log zerolog.Logger) error
	// Stop stops it. It is called once at shutdown, before the client
	// closes, when Start succeeded.
	Stop(ctx context.Context) error
}

// WholeFleet is an Extension that may serve every service (the xDS
// server): while WholeFleet reports true (its flags parsed), a gateway
// whose follow is not set follows all.
type WholeFleet interface {
	Extension
	// WholeFleet reports whether the extension, as configured, serves
	// every service.
	WholeFleet() bool
}

// wholeFleet reports whether one of exts serves every service.
func wholeFleet(exts []Extension) bool {
	for _, x := range exts {
		if w, ok := x.(WholeFleet); ok && w.WholeFleet() {
			return true
		}
	}
	return false
}
