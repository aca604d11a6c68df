package main

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the sync's counters, served on -metrics as Prometheus
// series and read by the tests. Safe for concurrent use.
type metrics struct {
	reg *prometheus.Registry
	// ops counts the commands that changed a backend, by backend and
	// command: add, enable, enable_health, weight, addr, ready, drain,
	// maint, shutdown, del.
	ops *prometheus.CounterVec
	// errors counts failures by backend and kind (errorKind).
	errors *prometheus.CounterVec
	// reads counts the reads of a whole backend (start, restart, resync,
	// recovery from an error).
	reads *prometheus.CounterVec
	// restarts counts the HAProxy restarts and reloads seen (a new
	// process ID behind the socket).
	restarts prometheus.Counter
	// servers is the number of servers the sync keeps in each backend.
	servers *prometheus.GaugeVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_haproxy_sync_ops_total",
			Help: "Runtime API commands that changed a backend, by command.",
		}, []string{"backend", "op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_haproxy_sync_errors_total",
			Help: "Failed syncs of a backend, by kind (socket, unknown_backend, static_algorithm, name_clash, host_name, refused, reply).",
		}, []string{"backend", "kind"}),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pushlb_haproxy_sync_reads_total",
			Help: "Reads of a whole backend's state (show servers state) to reconcile it.",
		}, []string{"backend"}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pushlb_haproxy_sync_haproxy_restarts_total",
			Help: "HAProxy restarts and reloads seen (a new process behind the socket).",
		}),
		servers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "pushlb_haproxy_sync_servers",
			Help: "Servers the sync keeps in the backend (draining ones included).",
		}, []string{"backend"}),
	}
	m.reg.MustRegister(m.ops, m.errors, m.reads, m.restarts, m.servers)
	return m
}
