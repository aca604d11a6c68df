// Command pushlb-k8s bridges Kubernetes EndpointSlices into pushlb's
// registry: the ready pods of the Services it selects are announced to
// every gateway as if they ran announce, terminating ones drain, gone ones
// are withdrawn. Run two replicas: they elect a leader with a
// coordination.k8s.io Lease. See docs/kubernetes.md.
//
//	pushlb-k8s -nats nats://nats:4222 -creds /etc/pushlb/bridge.creds \
//	    -selector pushlb.io/bridge=true -namespaces shop,payments \
//	    -pod-labels version,track -lease-namespace pushlb -id "$POD_NAME"
//
// Outside a cluster, -kubeconfig names the kubeconfig to use.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pushlb/pushlb/internal/cli/logx"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
	pushlbk8s "github.com/pushlb/pushlb/k8s"
	"github.com/pushlb/pushlb/serverlist"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

// run is the command: 0 on a clean stop, 2 on bad flags, 1 otherwise.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("pushlb-k8s", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		nc             natsconn.Config
		kubeconfig     = fs.String("kubeconfig", "", "kubeconfig file; empty: the in-cluster configuration")
		namespaces     = fs.String("namespaces", "", "namespaces to watch, comma-separated; empty: all")
		selector       = fs.String("selector", pushlbk8s.DefaultSelector, "label selector of the Services to bridge")
		podLabels      = fs.String("pod-labels", "", "pod labels copied into each record's metadata, comma-separated")
		owner          = fs.String("owner", pushlbk8s.DefaultOwner, "owner token of the bridge's records (one per cluster sharing a registry)")
		prefix         = fs.String("prefix", "", "subject prefix of events and registry (default lb)")
		leaseNamespace = fs.String("lease-namespace", "default", "namespace of the leader-election Lease")
		leaseName      = fs.String("lease-name", "pushlb-k8s", "name of the leader-election Lease")
		leaseDuration  = fs.Duration("lease-duration", 15*time.Second, "leader-election Lease duration: a crashed leader is replaced within it (renew deadline 2/3 of it, retries every 2/15)")
		id             = fs.String("id", "", "this replica's identity in the election (its pod name); empty: host name and a random suffix")
		metricsAddr    = fs.String("metrics", "", "address serving /metrics and /healthz; empty: none")
		debug          = fs.Bool("debug", false, "debug logs")
	)
	nc.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	level := zerolog.InfoLevel
	if *debug {
		level = zerolog.DebugLevel
	}
	log := logx.New(stderr, level)
	sel, err := labels.Parse(*selector)
	if err != nil {
		fmt.Fprintf(stderr, "pushlb-k8s: -selector: %v\n", err)
		return 2
	}
	var restCfg *rest.Config
	if *kubeconfig != "" {
		restCfg, err = clientcmd.BuildConfigFromFlags("", *kubeconfig)
	} else {
		restCfg, err = rest.InClusterConfig()
	}
	if err != nil {
		log.Error().Err(err).Msg("pushlb-k8s: Kubernetes configuration")
		return 1
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		log.Error().Err(err).Msg("pushlb-k8s: Kubernetes client")
		return 1
	}
	meta, err := metadata.NewForConfig(restCfg)
	if err != nil {
		log.Error().Err(err).Msg("pushlb-k8s: Kubernetes metadata client")
		return 1
	}
	nc.Name = "pushlb-k8s"
	conn, err := natsconn.Connect(ctx, nc, log)
	if err != nil {
		log.Error().Err(err).Msg("pushlb-k8s: NATS")
		return 1
	}
	defer conn.Close()
	js, err := jetstream.New(conn)
	if err != nil {
		log.Error().Err(err).Msg("pushlb-k8s: JetStream")
		return 1
	}
	reg, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Prefix: *prefix, Logger: log})
	if err != nil {
		log.Error().Err(err).Msg("pushlb-k8s: registry")
		return 1
	}
	promReg := prometheus.NewRegistry()
	b, err := pushlbk8s.New(kube, conn, reg, pushlbk8s.Config{
		Namespaces: splitList(*namespaces),
		Selector:   sel,
		PodLabels:  splitList(*podLabels),
		Metadata:   meta,
		Owner:      *owner,
		Prefix:     *prefix,
		Election: pushlbk8s.ElectionConfig{Namespace: *leaseNamespace, Name: *leaseName, Identity: *id,
			LeaseDuration: *leaseDuration, RenewDeadline: *leaseDuration * 2 / 3, RetryPeriod: *leaseDuration * 2 / 15},
		Logger:     log,
		Registerer: promReg,
	})
	if err != nil {
		log.Error().Err(err).Msg("pushlb-k8s")
		return 2
	}
	if *metricsAddr != "" {
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			log.Error().Err(err).Msg("pushlb-k8s: -metrics")
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(promReg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info().Str("addr", ln.Addr().String()).Msg("pushlb-k8s: metrics listening")
	}
	if err := b.Run(ctx); err != nil {
		log.Error().Err(err).Msg("pushlb-k8s")
		return 1
	}
	log.Info().Msg("pushlb-k8s: stopped")
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
