package gateway

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// Readiness is what /readyz answers, with status 200 when Ready and 503
// otherwise.
type Readiness struct {
	// Ready reports whether the gateway has routing state: its client has
	// started (the registry's lists are loaded) and not stopped. It stays
	// true while NATS is unreachable: the gateway then routes from its last
	// known lists, and a load balancer should keep sending it traffic.
	Ready bool `json:"ready"`
	// NATS is "connected" or "disconnected".
	NATS string `json:"nats"`
	// Since is when the NATS connection was lost; absent while connected.
	Since *time.Time `json:"since,omitempty"`
	// DisconnectedSeconds is how long NATS has been unreachable; 0 while
	// connected.
	DisconnectedSeconds float64 `json:"disconnectedSeconds"`
	// Services and Instances count the balancers and the servers they
	// list.
	Services  int `json:"services"`
	Instances int `json:"instances"`
}

// Readiness returns the gateway's readiness.
func (g *Gateway) Readiness() Readiness {
	r := Readiness{NATS: "disconnected"}
	if g.natsWatch != nil {
		connected, since := g.natsWatch.state()
		if connected {
			r.NATS = "connected"
		} else {
			r.Since = &since
			r.DisconnectedSeconds = time.Since(since).Seconds()
		}
	}
	if g.client == nil {
		return r
	}
	st := g.client.Stats()
	r.Ready = st.Started
	r.Services = len(st.Services)
	for _, s := range st.Services {
		r.Instances += s.Servers
	}
	return r
}

// serveHealth is liveness: the process serves.
func (g *Gateway) serveHealth(w http.ResponseWriter, _ *http.Request) {
	w.Write([]byte("ok\n"))
}

// serveReady is readiness: the gateway has routing state, NATS or not.
func (g *Gateway) serveReady(w http.ResponseWriter, _ *http.Request) {
	r := g.Readiness()
	w.Header().Set("Content-Type", "application/json")
	if !r.Ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	json.NewEncoder(w).Encode(r)
}

// natsWatch follows the NATS connection's status changes, to tell since
// when it has been lost and how often.
type natsWatch struct {
	nc   *nats.Conn
	ch   chan nats.Status
	done chan struct{}

	mu          sync.Mutex
	since       time.Time // when the connection was lost; zero while connected
	disconnects uint64
}

// watchNATS starts following nc; stop ends it.
func watchNATS(nc *nats.Conn) *natsWatch {
	w := &natsWatch{nc: nc, ch: nc.StatusChanged(nats.CONNECTED, nats.DISCONNECTED, nats.RECONNECTING), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *natsWatch) run() {
	defer close(w.done)
	for s := range w.ch {
		w.mu.Lock()
		if s == nats.CONNECTED {
			w.since = time.Time{}
		} else if w.since.IsZero() {
			w.since = time.Now()
			w.disconnects++
		}
		w.mu.Unlock()
	}
}

// stop stops following the connection and waits for the watch to end.
func (w *natsWatch) stop() {
	w.nc.RemoveStatusListener(w.ch)
	<-w.done
}

// state reports whether the connection is up (the client's own view) and,
// when it is not, since when.
func (w *natsWatch) state() (connected bool, since time.Time) {
	if w.nc.IsConnected() {
		return true, time.Time{}
	}
	w.mu.Lock()
	since = w.since
	w.mu.Unlock()
	if since.IsZero() {
		since = time.Now() // the status change is on its way
	}
	return false, since
}

func (w *natsWatch) disconnectCount() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.disconnects
}

var (
	descNATSConnected    = prometheus.NewDesc("pushlb_nats_connected", "1 while the gateway is connected to NATS, 0 while it routes from its last known lists.", nil, nil)
	descNATSDisconnected = prometheus.NewDesc("pushlb_nats_disconnected_seconds", "How long the NATS connection has been lost; 0 while connected.", nil, nil)
	descNATSDisconnects  = prometheus.NewDesc("pushlb_nats_disconnects_total", "NATS connections lost.", nil, nil)
)

// natsCollector exports a natsWatch's state.
type natsCollector struct{ w *natsWatch }

func (c natsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNATSConnected, descNATSDisconnected, descNATSDisconnects} {
		ch <- d
	}
}

func (c natsCollector) Collect(ch chan<- prometheus.Metric) {
	connected, since := c.w.state()
	up, down := 0.0, 0.0
	if connected {
		up = 1
	} else {
		down = time.Since(since).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descNATSConnected, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(descNATSDisconnected, prometheus.GaugeValue, down)
	ch <- prometheus.MustNewConstMetric(descNATSDisconnects, prometheus.CounterValue, float64(c.w.disconnectCount()))
}

var _ prometheus.Collector = natsCollector{}
