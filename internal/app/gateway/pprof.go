package gateway

import (
	"net/http"
	"net/http/pprof"
)

// registerPprof serves net/http/pprof under /debug/pprof/ on the admin
// mux: CPU, heap, allocation, goroutine and other profiles, for
// `go tool pprof http://ADMIN/debug/pprof/profile?seconds=15`. It is off
// unless Config.Pprof (-pprof) is set: a profile costs CPU while it runs,
// and the goroutine dump shows the gateway's internals.
func registerPprof(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// servePprofOff answers /debug/pprof/ when profiling is off with how to
// turn it on, instead of a bare 404.
func servePprofOff(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "profiling is off: start the gateway with -pprof (or pprof: true in its config file) to serve /debug/pprof/", http.StatusNotFound)
}
