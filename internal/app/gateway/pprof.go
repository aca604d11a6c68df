package gateway

import (
	"net/http"
	"net/http/pprof"
	"runtime"
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

// setHeapProfiling turns the runtime's heap profiling off
// (runtime.MemProfileRate 0) when profiles are not served (pprof false),
// since nobody can read them: the samples' stacks, and the table that
// finds them (some 1.5 MB once many are recorded), would stay in the
// gateway's memory for its life, and each sample walks its stack. With
// -pprof the heap profile samples at the rate in effect (Go's default: once
// every 512 KiB allocated). Main calls it before the gateway loads
// anything; what the program's initialisation sampled stays.
func setHeapProfiling(pprof bool) {
	if !pprof {
		runtime.MemProfileRate = 0
	}
}

// servePprofOff answers /debug/pprof/ when profiling is off with how to
// turn it on, instead of a bare 404.
func servePprofOff(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "profiling is off: start the gateway with -pprof (or pprof: true in its config file) to serve /debug/pprof/", http.StatusNotFound)
}
