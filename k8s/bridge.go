package pushlbk8s

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersdiscoveryv1 "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"

	"github.com/pushlb/pushlb/serverlist"
)

// Bridge keeps the registry equal to the EndpointSlices of the selected
// Services (package doc). Build it with New and run it with Run; Stats may
// be called at any time from any goroutine.
type Bridge struct {
	kube kubernetes.Interface
	nc   *nats.Conn
	reg  *serverlist.Registry
	cfg  Config
	m    *metrics

	// Set by Run before the informers start, read-only after.
	listers []nsListers

	mu    sync.Mutex
	queue workqueue.TypedRateLimitingInterface[string] // the current term's; nil while not leading
	// podServices maps a pod ("<namespace>/<name>") to the Services whose
	// records carry its labels, so that a label change requeues them.
	podServices map[string]map[string]bool
	running     bool
}

// nsListers are the listers of one informer factory (one namespace, or
// all when namespace is "").
type nsListers struct {
	namespace string
	services  listerscorev1.ServiceLister
	slices    listersdiscoveryv1.EndpointSliceLister
	pods      cache.GenericLister // Pods' metadata; nil without Config.PodLabels
}

// New builds a Bridge that watches kube and writes into reg, publishing
// events on nc. It starts nothing.
func New(kube kubernetes.Interface, nc *nats.Conn, reg *serverlist.Registry, cfg Config) (*Bridge, error) {
	if kube == nil || nc == nil || reg == nil {
		return nil, fmt.Errorf("%w: a Kubernetes client, a NATS connection and a registry are needed", ErrInvalidConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = reg.Config().TTL / 3
	}
	if cfg.Election.Identity == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.Election.Identity = host + "-" + hex.EncodeToString(b[:])
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("pushlbk8s: metrics: %w", err)
	}
	return &Bridge{kube: kube, nc: nc, reg: reg, cfg: cfg, m: m, podServices: make(map[string]map[string]bool)}, nil
}

// Stats returns the bridge's counters.
func (b *Bridge) Stats() Stats { return b.m.stats() }

// Identity is this replica's name in the leader election.
func (b *Bridge) Identity() string { return b.cfg.Election.Identity }

// Run watches the API server and, while this replica leads, writes the
// registry, until ctx ends. It returns once every goroutine it started has
// stopped; it withdraws nothing (the records live on their lease for the
// next leader). A Bridge runs once.
func (b *Bridge) Run(ctx context.Context) error {
	b.mu.Lock()
	if b.running {
		b.mu.Unlock()
		return fmt.Errorf("%w: Run called twice", ErrInvalidConfig)
	}
	b.running = true
	b.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	factories, err := b.startInformers(ctx)
	defer func() {
		cancel()
		for _, f := range factories {
			f.Shutdown() // waits for the informers' goroutines
		}
	}()
	if err != nil {
		return err
	}
	return b.elect(ctx)
}

// startInformers starts the informers of every namespace watched and waits
// for their caches.
// factory is what Run needs of an informer factory (typed or metadata).
type factory interface {
	Start(stopCh <-chan struct{})
	Shutdown()
}

func (b *Bridge) startInformers(ctx context.Context) ([]factory, error) {
	nss := b.cfg.Namespaces
	if len(nss) == 0 {
		nss = []string{metav1.NamespaceAll}
	}
	selector := b.cfg.Selector.String()
	var (
		factories []factory
		synced    []func() bool // each factory's cache sync, waited for below
	)
	for _, ns := range nss {
		svcF := informers.NewSharedInformerFactoryWithOptions(b.kube, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
		otherF := informers.NewSharedInformerFactoryWithOptions(b.kube, 0, informers.WithNamespace(ns))
		factories = append(factories, svcF, otherF)
		for _, f := range []informers.SharedInformerFactory{svcF, otherF} {
			synced = append(synced, func() bool { return allSynced(f.WaitForCacheSync(ctx.Done())) })
		}
		l := nsListers{namespace: ns}
		svcInf := svcF.Core().V1().Services()
		if _, err := svcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { b.enqueueObject(o) },
			UpdateFunc: func(_, o any) { b.enqueueObject(o) },
			DeleteFunc: func(o any) { b.enqueueObject(o) },
		}); err != nil {
			return factories, fmt.Errorf("pushlbk8s: %w", err)
		}
		l.services = svcInf.Lister()
		sliceInf := otherF.Discovery().V1().EndpointSlices()
		if _, err := sliceInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { b.enqueueSlice(o) },
			UpdateFunc: func(old, o any) { b.enqueueSlice(old); b.enqueueSlice(o) },
			DeleteFunc: func(o any) { b.enqueueSlice(o) },
		}); err != nil {
			return factories, fmt.Errorf("pushlbk8s: %w", err)
		}
		l.slices = sliceInf.Lister()
		if len(b.cfg.PodLabels) > 0 {
			podF := metadatainformer.NewFilteredSharedInformerFactory(b.cfg.Metadata, 0, ns, nil)
			factories = append(factories, podF)
			synced = append(synced, func() bool { return allSynced(podF.WaitForCacheSync(ctx.Done())) })
			podInf := podF.ForResource(corev1.SchemeGroupVersion.WithResource("pods"))
			if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(o any) { b.enqueuePod(o) },
				UpdateFunc: func(_, o any) { b.enqueuePod(o) },
				DeleteFunc: func(o any) { b.enqueuePod(o) },
			}); err != nil {
				return factories, fmt.Errorf("pushlbk8s: %w", err)
			}
			l.pods = podInf.Lister()
		}
		b.listers = append(b.listers, l)
	}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	for _, ok := range synced {
		if !ok() {
			return factories, fmt.Errorf("pushlbk8s: caches not synced: %w", ctx.Err())
		}
	}
	b.cfg.Logger.Info().Strs("namespaces", nss).Str("selector", selector).Msg("pushlbk8s: caches synced")
	return factories, nil
}

// listersFor returns the listers that hold namespace.
func (b *Bridge) listersFor(namespace string) (nsListers, bool) {
	for _, l := range b.listers {
		if l.namespace == metav1.NamespaceAll || l.namespace == namespace {
			return l, true
		}
	}
	return nsListers{}, false
}

func (b *Bridge) enqueue(key string) {
	b.mu.Lock()
	q := b.queue
	b.mu.Unlock()
	if q != nil {
		q.Add(key)
	}
}

func (b *Bridge) enqueueObject(o any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
		b.enqueue(key)
	}
}

func (b *Bridge) enqueueSlice(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	s, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
		b.enqueue(s.Namespace + "/" + name)
	}
}

func (b *Bridge) enqueuePod(o any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o)
	if err != nil {
		return
	}
	b.mu.Lock()
	svcs := make([]string, 0, len(b.podServices[key]))
	for s := range b.podServices[key] {
		svcs = append(svcs, s)
	}
	b.mu.Unlock()
	for _, s := range svcs {
		b.enqueue(s)
	}
}

// elect runs the leader election until ctx ends, leading whenever elected.
func (b *Bridge) elect(ctx context.Context) error {
	e := b.cfg.Election
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name},
		Client:     b.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	for ctx.Err() == nil {
		// OnStartedLeading runs on a goroutine of its own that Run does not
		// wait for: it hands the term's context over, and the term runs
		// here, so that two terms never overlap.
		terms := make(chan context.Context, 1)
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   e.LeaseDuration,
			RenewDeadline:   e.RenewDeadline,
			RetryPeriod:     e.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            e.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(tctx context.Context) { terms <- tctx },
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			le.Run(ctx)
		}()
		select {
		case tctx := <-terms:
			b.lead(tctx)
		case <-done:
		}
		<-done
	}
	return nil
}

// lead is one leadership term: it reconciles every selected Service, then
// each one that changes, and renews the records, until tctx ends.
func (b *Bridge) lead(tctx context.Context) {
	if tctx.Err() != nil {
		return
	}
	b.m.terms.Add(1)
	b.m.setLeading(true)
	defer b.m.setLeading(false)
	b.cfg.Logger.Info().Str("identity", b.cfg.Election.Identity).Msg("pushlbk8s: leading")
	w := newWriter(b.nc, b.reg, b.cfg, b.m)
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 10*time.Second),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "pushlb-k8s"})
	b.mu.Lock()
	b.queue = q
	b.mu.Unlock()
	for _, l := range b.listers {
		svcs, err := l.services.List(labels.Everything())
		if err != nil {
			continue
		}
		for _, s := range svcs {
			q.Add(s.Namespace + "/" + s.Name)
		}
	}
	var wg sync.WaitGroup
	for range b.cfg.Workers {
		wg.Go(func() {
			for b.work(tctx, q, w) {
			}
		})
	}
	wg.Go(func() {
		t := time.NewTicker(b.cfg.RenewInterval)
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-t.C:
				w.renew(tctx)
			}
		}
	})
	<-tctx.Done()
	b.mu.Lock()
	b.queue = nil
	b.mu.Unlock()
	q.ShutDown()
	wg.Wait()
	b.cfg.Logger.Info().Str("identity", b.cfg.Election.Identity).Msg("pushlbk8s: no longer leading; records left to the next leader")
}

// work reconciles one queued Service; false once the queue is shut down.
func (b *Bridge) work(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], w *writer) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	if err := b.reconcile(ctx, w, key); err != nil {
		if ctx.Err() == nil {
			b.cfg.Logger.Warn().Err(err).Str("service", key).Msg("pushlbk8s: reconcile failed; retrying")
			q.AddRateLimited(key)
		}
		return true
	}
	q.Forget(key)
	return true
}

// reconcile makes the registry equal to one Service's slices.
func (b *Bridge) reconcile(ctx context.Context, w *writer, key string) error {
	b.m.reconciles.Add(1)
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	l, ok := b.listersFor(ns)
	if !ok {
		return nil
	}
	svc, err := l.services.Services(ns).Get(name)
	if err != nil {
		svc = nil // deleted, or no longer selected: withdraw everything
	}
	var sl []*discoveryv1.EndpointSlice
	if svc != nil {
		sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name})
		if sl, err = l.slices.EndpointSlices(ns).List(sel); err != nil {
			return fmt.Errorf("pushlbk8s: list slices of %s: %w", key, err)
		}
	}
	var pods podLabels
	if l.pods != nil {
		pods = func(pns, pname string) (map[string]string, bool) {
			o, err := l.pods.ByNamespace(pns).Get(pname)
			if err != nil {
				return nil, false
			}
			m, ok := o.(*metav1.PartialObjectMetadata)
			if !ok {
				return nil, false
			}
			return m.Labels, true
		}
	}
	service, wants, problems := desired(svc, sl, b.cfg.PodLabels, pods, b.cfg.Owner)
	for _, p := range problems {
		b.m.malformedInc(p.reason)
		b.cfg.Logger.Warn().Str("object", p.object).Str("reason", p.reason).Str("detail", p.detail).
			Msg("pushlbk8s: malformed object skipped")
	}
	if l.pods != nil {
		b.notePods(key, sl)
	}
	return w.apply(ctx, key, service, wants)
}

// notePods records which pods the Service's slices name, for enqueuePod.
func (b *Bridge) notePods(svcKey string, sl []*discoveryv1.EndpointSlice) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for pod, svcs := range b.podServices {
		delete(svcs, svcKey)
		if len(svcs) == 0 {
			delete(b.podServices, pod)
		}
	}
	for _, s := range sl {
		for _, ep := range s.Endpoints {
			if ref := ep.TargetRef; ref != nil && ref.Kind == "Pod" {
				ns := ref.Namespace
				if ns == "" {
					ns = s.Namespace
				}
				k := ns + "/" + ref.Name
				if b.podServices[k] == nil {
					b.podServices[k] = make(map[string]bool)
				}
				b.podServices[k][svcKey] = true
			}
		}
	}
}

// allSynced reports whether every cache of a factory synced.
func allSynced[K comparable](m map[K]bool) bool {
	for _, ok := range m {
		if !ok {
			return false
		}
	}
	return true
}
