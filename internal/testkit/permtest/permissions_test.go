package permtest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	pushlb "github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/convergence"
	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/cli/natsconn"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// The shipped configurations, for the default prefix.
const (
	examples = "../../../examples/nats-server/"
	prefix   = events.DefaultPrefix
	ttl      = 30 * time.Second
)

var bucket = serverlist.BucketName(prefix)

// role is one of the users the example configurations define.
type role string

const (
	operator role = "OPERATOR"
	gateway  role = "GATEWAY"
	orders   role = "ANNOUNCE_ORDERS"
	billing  role = "ANNOUNCE_BILLING"
	reaper   role = "REAPER"
	viewer   role = "VIEWER"
	// The Kubernetes bridge (pushlb-k8s) bridging service web.
	bridge role = "BRIDGE_WEB"
)

var roles = []role{operator, gateway, orders, billing, reaper, viewer, bridge}

// user is the user name users.conf gives a role: pushlb-announce-orders.
func (r role) user() string {
	return "pushlb-" + strings.ReplaceAll(strings.ToLower(string(r)), "_", "-")
}

// credentials is how one role of one configuration style authenticates:
// as natsconn takes it (files only, so nothing is on a command line), as a
// raw client option for the forgery attempts, and as the announce process
// takes it (flags and environment).
type credentials struct {
	conn    natsconn.Config
	option  nats.Option
	flags   []string
	environ []string
}

// style is a shipped configuration and the secrets it expects from
// nats-server's environment.
type style struct {
	name  string
	file  string
	setup func(t *testing.T) map[role]credentials
}

var styles = []style{
	{"users and passwords", examples + "users.conf", func(t *testing.T) map[role]credentials {
		creds := map[role]credentials{}
		for _, r := range roles {
			pw := rand.Text()
			t.Setenv("PUSHLB_"+string(r)+"_PASSWORD", pw)
			file := writeSecret(t, string(r)+".password", pw+"\n")
			creds[r] = credentials{
				conn:   natsconn.Config{User: r.user(), PasswordFile: file},
				option: nats.UserInfo(r.user(), pw),
				flags:  []string{"-user", r.user(), "-password-file", file},
			}
		}
		return creds
	}},
	{"nkeys", examples + "nkeys.conf", func(t *testing.T) map[role]credentials {
		creds := map[role]credentials{}
		for _, r := range roles {
			kp, err := nkeys.CreateUser()
			if err != nil {
				t.Fatal(err)
			}
			pub, _ := kp.PublicKey()
			seed, _ := kp.Seed()
			t.Setenv("PUSHLB_"+string(r)+"_NKEY", pub)
			file := writeSecret(t, string(r)+".nk", string(seed)+"\n")
			opt, err := nats.NkeyOptionFromSeed(file)
			if err != nil {
				t.Fatal(err)
			}
			creds[r] = credentials{
				conn:   natsconn.Config{NkeyFile: file},
				option: opt,
				// The seed file from the environment, not a flag.
				environ: []string{natsconn.EnvNkeySeedFile + "=" + file},
			}
		}
		return creds
	}},
}

func writeSecret(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// client is a raw connection of one role, for the attempts the permissions
// must refuse. The server reports a refusal asynchronously; errs receives
// every report in the order the server sent it.
type client struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

func connect(t *testing.T, srv *natstest.Server, c credentials) *client {
	t.Helper()
	errs := make(chan error, 64)
	nc := srv.Connect(t, c.option, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &client{nc: nc, js: js, errs: errs}
}

// refusal waits for the server's report that op on subject was refused.
// op is "Publish" or "Subscription".
func (c *client) refusal(t *testing.T, op, subject string) {
	t.Helper()
	want := op + ` to "` + subject + `"`
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), want) {
				return
			}
			t.Errorf("unexpected report while waiting for the refusal of %s: %v", want, err)
		case <-timer.C:
			t.Fatalf("the server did not refuse %s", want)
		}
	}
}

// refusedPublish publishes data on subject and waits for the refusal.
func (c *client) refusedPublish(t *testing.T, subject string, data []byte) {
	t.Helper()
	c.publish(t, subject, data)
}

func (c *client) publish(t *testing.T, subject string, data []byte) {
	t.Helper()
	if err := c.nc.Publish(subject, data); err != nil {
		t.Fatal(err)
	}
	c.refusal(t, "Publish", subject)
}

// refusedRequest runs a JetStream call whose request goes to subject,
// waits for the server to refuse the request, and checks that the call
// failed. The call gets no answer: it ends when its context does, which
// the refusal cancels.
func (c *client) refusedRequest(t *testing.T, subject string, call func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	c.refusal(t, "Publish", subject)
	cancel()
	if err := testutil.Receive(t, done, 10*time.Second, "the refused call to return"); err == nil {
		t.Fatalf("the call to %s succeeded", subject)
	}
}

// sentinel proves that the server reported every refusal of what c sent
// before: it publishes where c may not, waits for that refusal, and fails
// the test on any other report on the way.
func (c *client) sentinel(t *testing.T) {
	t.Helper()
	c.refusedPublish(t, "permtest.sentinel", nil)
}

// instanceKey is the registry key of an instance.
func instanceKey(t *testing.T, service, id string) string {
	t.Helper()
	k, err := serverlist.EncodeKey(service, id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func instanceValue(service, id string, port int) []byte {
	return []byte(`{"service":"` + service + `","instanceId":"` + id + `","host":"127.0.0.1","port":` + strconv.Itoa(port) + `,"incarnation":` + strconv.FormatInt(time.Now().UnixNano(), 10) + `}`)
}

// forgedEvent publishes an event that c may not send and waits for the
// refusal.
func (c *client) forgedEvent(t *testing.T, kind events.Kind, service, id string) {
	t.Helper()
	subject, data := event(kind, service, id)
	c.publish(t, subject, data)
}

func event(kind events.Kind, service, id string) (string, []byte) {
	subject, data, err := events.EncodeMessage(prefix, events.Event{Kind: kind, Service: service, InstanceID: id, Incarnation: time.Now().UnixNano(), At: time.Now()})
	if err != nil {
		panic(err)
	}
	return subject, data
}

// TestPermissions runs nats-server with each shipped configuration and
// shows that the push path works under it and that no role can do more
// than docs/security.md says: an announcer cannot forge another service's
// events or registry entries, nor change the bucket; a gateway cannot write
// at all; the Kubernetes bridge writes the services it bridges and no
// other, and no announcer writes them. Each refusal is the server's own (a permissions violation naming
// the subject), waited for, never inferred from silence.
//
// The gateway runs in both ways of watching the registry: follow requested
// (the default: a push consumer per followed service) and follow all (a
// pull consumer over every record, which needs
// $JS.API.CONSUMER.MSG.NEXT).
func TestPermissions(t *testing.T) {
	for _, st := range styles {
		for _, follow := range []pushlb.FollowMode{pushlb.FollowRequested, pushlb.FollowAll} {
			t.Run(st.name+"/follow_"+string(follow), func(t *testing.T) { testPermissions(t, st, follow) })
		}
	}
}

func testPermissions(t *testing.T, st style, follow pushlb.FollowMode) {
	creds := st.setup(t)
	srv := natstest.Start(t, natstest.WithConfigFile(t, st.file))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	// The operator creates the bucket, as deploy tooling would (nats kv
	// add): no pushlb process may create or change it.
	op := connect(t, srv, creds[operator])
	kv, err := op.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: bucket, Description: "pushlb instance registry", History: 1, TTL: ttl, LimitMarkerTTL: ttl,
	})
	if err != nil {
		t.Fatalf("the operator creates the bucket: %v", err)
	}

	// A gateway: the public client over a connection made by natsconn with
	// the gateway's credentials, read from a file.
	var gwLogs testutil.SyncBuffer
	gwLog := zerolog.New(&gwLogs)
	gwCfg := creds[gateway].conn
	gwCfg.URL = srv.URL()
	gwConn, err := natsconn.Connect(ctx, gwCfg, gwLog)
	if err != nil {
		t.Fatal(err)
	}
	defer gwConn.Close()
	lb, err := pushlb.New(gwConn, pushlb.Config{Prefix: prefix, Follow: follow, Reaper: true, Report: pushlb.ReportConfig{ID: gateway.user(), Interval: convergence.MinInterval}}, pushlb.WithLogger(gwLog))
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.Start(ctx); err != nil {
		t.Fatalf("the gateway starts with read-only permissions: %v\n%s", err, gwLogs.String())
	}
	defer lb.Close()
	httpc := &http.Client{Transport: lb.Transport(), Timeout: 5 * time.Second}
	get := func(url string) (string, error) {
		resp, err := httpc.Get(url)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}

	// A billing instance, announced by billing's own announcer.
	billingBackend := testpub.Backend(t, "billing-1")
	billingConn, err := natsconn.Connect(ctx, withURL(creds[billing].conn, srv.URL()), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer billingConn.Close()
	testpub.Announce(t, billingConn, "billing", "", billingBackend)
	billingID := billingBackend.URL
	testutil.Eventually(t, "billing routed", func() bool {
		body, err := get("http://billing/x")
		return err == nil && body == "billing-1 /x"
	})

	// An orders instance, announced by a real announce process whose
	// credentials come from a file or the environment.
	ordersBackend := testpub.Backend(t, "orders-1")
	args := append([]string{"-nats", srv.URL(), "-service", "orders", "-id", "orders-1",
		"-addr", ordersBackend.Listener.Addr().String(), "-log-level", "debug"}, creds[orders].flags...)
	cmd := exec.Command(announceBin, args...)
	cmd.Env = append(os.Environ(), creds[orders].environ...)
	ann := testutil.StartCmd(t, cmd)
	ann.WaitFor(t, "announced online", 20*time.Second)
	testutil.Eventually(t, "orders routed", func() bool {
		body, err := get("http://orders/x")
		return err == nil && body == "orders-1 /x"
	})

	t.Run("an announcer cannot forge another service", func(t *testing.T) {
		x := connect(t, srv, creds[orders])
		// Billing's events: a forged offline of the real instance, a
		// forged online of an invented one.
		x.forgedEvent(t, events.Offline, "billing", billingID)
		x.forgedEvent(t, events.Online, "billing", "evil")
		// Billing's registry entries: the real key with the attacker's
		// port, a new key, and the removal of the real one.
		realKey, newKey := instanceKey(t, "billing", billingID), instanceKey(t, "billing", "evil")
		xkv, err := x.js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatalf("an announcer opens the bucket: %v", err)
		}
		x.refusedRequest(t, "$KV."+bucket+"."+realKey, func(ctx context.Context) error {
			_, err := xkv.Put(ctx, realKey, instanceValue("billing", billingID, 1))
			return err
		})
		x.refusedRequest(t, "$KV."+bucket+"."+newKey, func(ctx context.Context) error {
			_, err := xkv.Create(ctx, newKey, instanceValue("billing", "evil", 1))
			return err
		})
		x.refusedRequest(t, "$KV."+bucket+"."+realKey, func(ctx context.Context) error { return xkv.Purge(ctx, realKey) })
		// Nor read what others announce.
		if _, err := x.nc.Subscribe(events.WildcardSubject(prefix), func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		x.refusal(t, "Subscription", events.WildcardSubject(prefix))
		x.sentinel(t)

		// Billing's entry and routing are untouched.
		e, err := kv.Get(ctx, realKey)
		if err != nil || !strings.Contains(string(e.Value()), billingBackend.Listener.Addr().(*net.TCPAddr).IP.String()) {
			t.Fatalf("billing's entry: %v %s", err, valueOf(e))
		}
		if body, err := get("http://billing/x"); err != nil || body != "billing-1 /x" {
			t.Fatalf("billing after the attempts: %q, %v", body, err)
		}
	})

	t.Run("no pushlb process can change the bucket", func(t *testing.T) {
		stream, err := op.js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		shorter := stream.CachedInfo().Config
		shorter.MaxAge, shorter.SubjectDeleteMarkerTTL = 5*time.Second, 5*time.Second
		for _, r := range []role{orders, gateway} {
			x := connect(t, srv, creds[r])
			// The stream API itself: the KV helpers would stop at the
			// account information ($JS.API.INFO), refused as well.
			x.refusedRequest(t, "$JS.API.STREAM.UPDATE.KV_"+bucket, func(ctx context.Context) error {
				_, err := x.js.UpdateStream(ctx, shorter)
				return err
			})
			x.refusedRequest(t, "$JS.API.STREAM.DELETE.KV_"+bucket, func(ctx context.Context) error { return x.js.DeleteKeyValue(ctx, bucket) })
			x.refusedRequest(t, "$JS.API.STREAM.PURGE.KV_"+bucket, func(ctx context.Context) error {
				s, err := x.js.Stream(ctx, "KV_"+bucket)
				if err != nil {
					return err
				}
				return s.Purge(ctx)
			})
			x.refusedRequest(t, "$JS.API.STREAM.CREATE.KV_"+bucket, func(ctx context.Context) error {
				_, err := x.js.CreateStream(ctx, shorter)
				return err
			})
			x.sentinel(t)
		}
		st, err := kv.Status(ctx)
		if err != nil || st.TTL() != ttl {
			t.Fatalf("bucket TTL %v (%v), want the operator's %v", st.TTL(), err, ttl)
		}
		// Creating is not updating: the operator's own create with another
		// TTL is refused by the server, so a grant of STREAM.CREATE (to
		// recreate a lost bucket) would not let a process change the TTL.
		if _, err := op.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, TTL: 5 * time.Second, LimitMarkerTTL: 5 * time.Second}); err == nil {
			t.Fatal("a create with another TTL changed the existing bucket")
		}
	})

	t.Run("a gateway cannot write", func(t *testing.T) {
		x := connect(t, srv, creds[gateway])
		x.forgedEvent(t, events.Offline, "orders", "orders-1")
		x.forgedEvent(t, events.Online, "orders", "evil")
		xkv, err := x.js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		key := instanceKey(t, "orders", "orders-1")
		x.refusedRequest(t, "$KV."+bucket+"."+key, func(ctx context.Context) error {
			_, err := xkv.Put(ctx, key, instanceValue("orders", "orders-1", 1))
			return err
		})
		x.refusedRequest(t, "$KV."+bucket+"."+key, func(ctx context.Context) error { return xkv.Delete(ctx, key) })
		x.sentinel(t)
		if body, err := get("http://orders/x"); err != nil || body != "orders-1 /x" {
			t.Fatalf("orders after the attempts: %q, %v", body, err)
		}
	})

	t.Run("the bridge writes the services it bridges, and only it", func(t *testing.T) {
		// The bridge's user writes a record of web as pushlb-k8s does: a
		// create-only write, a read of whose it is, a renewal by
		// compare-and-set, the listing of the service when it starts
		// leading, and web's online event.
		x := connect(t, srv, creds[bridge])
		reg, err := serverlist.Open(ctx, x.js, serverlist.RegistryConfig{Prefix: prefix})
		if err != nil {
			t.Fatalf("the bridge opens the bucket: %v", err)
		}
		webBackend := testpub.Backend(t, "web-1")
		addr := webBackend.Listener.Addr().(*net.TCPAddr)
		web := serverlist.Instance{Service: "web", InstanceID: "shop/web-1:http", Host: addr.IP.String(), Port: addr.Port,
			Owner: "pushlb-k8s", Incarnation: time.Now().UnixNano()}
		rev, err := reg.Create(ctx, web)
		if err != nil {
			t.Fatalf("the bridge creates web's record: %v", err)
		}
		if e, err := reg.GetEntry(ctx, web.Service, web.InstanceID); err != nil || e.Revision != rev || e.Owner != web.Owner {
			t.Fatalf("the bridge reads web's record back: %+v, %v", e, err)
		}
		if rev, err = reg.Update(ctx, web, rev); err != nil {
			t.Fatalf("the bridge renews web's record: %v", err)
		}
		if list, err := reg.List(ctx, web.Service); err != nil || len(list) != 1 || list[0].InstanceID != web.InstanceID {
			t.Fatalf("the bridge lists web: %+v, %v", list, err)
		}
		follower := connect(t, srv, creds[gateway])
		sub, err := follower.nc.SubscribeSync(events.Subject(prefix, web.Service, events.Online))
		if err != nil {
			t.Fatal(err)
		}
		if err := follower.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		subject, data, err := events.EncodeMessage(prefix, events.Event{Kind: events.Online, Service: web.Service,
			InstanceID: web.InstanceID, Incarnation: web.Incarnation, At: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
		msg, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("web's online event from the bridge: %v", err)
		}
		if ev, err := events.DecodeMessage(prefix, msg.Subject, msg.Data); err != nil || ev.InstanceID != web.InstanceID {
			t.Fatalf("web's online event: %+v, %v", ev, err)
		}
		testutil.Eventually(t, "web routed", func() bool {
			body, err := get("http://web/x")
			return err == nil && body == "web-1 /x"
		})

		// Not the records of orders, announce's service: neither over the
		// live instance's record nor a new one, nor its removal ...
		ordersKey := instanceKey(t, "orders", "orders-1")
		xkv := reg.KeyValue()
		x.refusedRequest(t, "$KV."+bucket+"."+ordersKey, func(ctx context.Context) error {
			_, err := xkv.Put(ctx, ordersKey, instanceValue("orders", "orders-1", 1))
			return err
		})
		x.refusedRequest(t, "$KV."+bucket+"."+instanceKey(t, "orders", "evil"), func(ctx context.Context) error {
			_, err := reg.Create(ctx, serverlist.Instance{Service: "orders", InstanceID: "evil", Host: "127.0.0.1", Port: 1,
				Owner: web.Owner, Incarnation: time.Now().UnixNano()})
			return err
		})
		x.refusedRequest(t, "$KV."+bucket+"."+ordersKey, func(ctx context.Context) error { return xkv.Purge(ctx, ordersKey) })
		// ... nor orders' events ...
		x.forgedEvent(t, events.Offline, "orders", "orders-1")
		x.forgedEvent(t, events.Online, "orders", "evil")
		// ... nor any lease: orders', nor even web's (the bridge's records
		// carry their own, the bucket's TTL) ...
		for _, in := range []serverlist.Instance{{Service: "orders", InstanceID: "orders-1"}, web} {
			lease, err := serverlist.LeaseKey(in.Service, in.InstanceID)
			if err != nil {
				t.Fatal(err)
			}
			x.refusedRequest(t, "$KV."+bucket+"."+lease, func(ctx context.Context) error {
				_, err := reg.PutLease(ctx, in.Service, in.InstanceID, web.Owner)
				return err
			})
		}
		// ... nor an advisory. Nothing the bridge did before was refused:
		// each refusal above waited for its own report, and failed on any
		// other.
		x.refusedPublish(t, events.DisconnectAdvisorySubject(prefix), []byte(`{"type":"io.nats.server.advisory.v1.client_disconnect"}`))
		x.sentinel(t)

		// The orders announcer may not write the bridged service's
		// records: over the bridge's record, nor a new one.
		a := connect(t, srv, creds[orders])
		akv, err := a.js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatalf("an announcer opens the bucket: %v", err)
		}
		webKey, evilKey := instanceKey(t, web.Service, web.InstanceID), instanceKey(t, web.Service, "evil")
		a.refusedRequest(t, "$KV."+bucket+"."+webKey, func(ctx context.Context) error {
			_, err := akv.Put(ctx, webKey, instanceValue(web.Service, web.InstanceID, 1))
			return err
		})
		a.refusedRequest(t, "$KV."+bucket+"."+evilKey, func(ctx context.Context) error {
			_, err := akv.Create(ctx, evilKey, instanceValue(web.Service, "evil", 1))
			return err
		})
		a.sentinel(t)

		// Orders' record and web's are as their writers left them.
		var held serverlist.Instance
		e, err := kv.Get(ctx, ordersKey)
		if err != nil || json.Unmarshal(e.Value(), &held) != nil || held.Port != ordersBackend.Listener.Addr().(*net.TCPAddr).Port {
			t.Fatalf("orders' entry: %v %s", err, valueOf(e))
		}
		if _, err := kv.Get(ctx, instanceKey(t, "orders", "evil")); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("the bridge's orders entry: %v, want none", err)
		}
		if e, err := reg.GetEntry(ctx, web.Service, web.InstanceID); err != nil || e.Revision != rev || e.Port != web.Port {
			t.Fatalf("web's entry: %+v, %v", e, err)
		}
		if _, err := kv.Get(ctx, evilKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("the announcer's web entry: %v, want none", err)
		}
		if body, err := get("http://orders/x"); err != nil || body != "orders-1 /x" {
			t.Fatalf("orders after the attempts: %q, %v", body, err)
		}

		// The bridge removes its record (and would its owner's lease) as
		// it withdraws a pod, and the gateway drops it.
		if err := reg.DeregisterOwned(ctx, web.Service, web.InstanceID, web.Owner); err != nil {
			t.Fatalf("the bridge removes web's record: %v", err)
		}
		subject, data, err = events.EncodeMessage(prefix, events.Event{Kind: events.Offline, Service: web.Service,
			InstanceID: web.InstanceID, Incarnation: web.Incarnation, At: time.Now(), Reason: "k8s: endpoint gone or not ready"})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "web dropped after the bridge's removal", func() bool {
			b, err := lb.Balancer(web.Service)
			return err == nil && len(b.Servers()) == 0
		})
		x.sentinel(t)
	})

	t.Run("a gateway reports under its own ID, and only viewers read the reports", func(t *testing.T) {
		vc := connect(t, srv, creds[viewer])
		v, err := convergence.NewViewer(vc.nc, convergence.ViewerConfig{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Start(); err != nil {
			t.Fatal(err)
		}
		defer v.Close()
		testutil.Eventually(t, "the gateway's report of orders", func() bool {
			for _, sv := range v.View().Services {
				if sv.Name == "orders" && sv.Gateways == 1 {
					return true
				}
			}
			return false
		})
		x := connect(t, srv, creds[gateway])
		// Not under another gateway's ID.
		x.refusedPublish(t, convergence.Subject(prefix, reaper.user()), []byte(`{}`))
		// Not a reader of the reports.
		if _, err := x.nc.Subscribe(convergence.WildcardSubject(prefix), func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		x.refusal(t, "Subscription", convergence.WildcardSubject(prefix))
		x.sentinel(t)
		vc.sentinel(t)
	})

	t.Run("advisories reach the gateway, and nobody may forge one", func(t *testing.T) {
		// The read-only gateway receives the server's advisories (its
		// start's check proved it) ...
		testutil.Eventually(t, "the gateway's advisory check", func() bool { return lb.Stats().Advisories.State == "on" })
		// ... no announcer may publish one ...
		x := connect(t, srv, creds[orders])
		x.refusedPublish(t, events.DisconnectAdvisorySubject(prefix), []byte(`{"type":"io.nats.server.advisory.v1.client_disconnect"}`))
		// ... and a billing instance whose process dies (its listener and
		// its connection close) leaves the gateway's list by one.
		conn, err := natsconn.Connect(ctx, withURL(creds[billing].conn, srv.URL()), zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		crashed := testpub.Backend(t, "billing-3")
		testpub.Announce(t, conn, "billing", "", crashed)
		testutil.Eventually(t, "billing-3 routed", func() bool {
			b, err := lb.Balancer("billing")
			return err == nil && len(b.Servers()) == 2
		})
		crashed.Close()
		conn.Close()
		testutil.Eventually(t, "billing-3 removed by its advisory", func() bool {
			b, err := lb.Balancer("billing")
			return err == nil && len(b.Servers()) == 1 && lb.Stats().Advisories.Removals == 1
		})
	})

	t.Run("a reaper removes the record of an ended lease", func(t *testing.T) {
		// The gateway may not reap: it tried the lock once and stays out.
		testutil.Eventually(t, "the gateway out of the reaper election", func() bool { return lb.Stats().Reaper.NotPermitted })
		rc, err := natsconn.Connect(ctx, withURL(creds[reaper].conn, srv.URL()), zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		rjs, err := jetstream.New(rc)
		if err != nil {
			t.Fatal(err)
		}
		reg, err := serverlist.Open(ctx, rjs, serverlist.RegistryConfig{Prefix: prefix})
		if err != nil {
			t.Fatalf("a reaper opens the bucket: %v", err)
		}
		r := serverlist.NewReaper(reg, serverlist.ReaperConfig{Node: "permtest-reaper"})
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		testutil.Eventually(t, "the reaper to lead", r.Leader)

		// A second billing instance crashes: its publisher stops without a
		// word, and its lease ends (the operator ends it here rather than
		// waiting out the 30 s TTL; an expiry is the same removal).
		crashed := testpub.Backend(t, "billing-2")
		pub := testpub.Announce(t, billingConn, "billing", "", crashed)
		testutil.Eventually(t, "billing-2 routed", func() bool {
			b, err := lb.Balancer("billing")
			return err == nil && len(b.Servers()) == 2
		})
		pub.Close()
		lease, _ := serverlist.LeaseKey("billing", crashed.URL)
		if err := kv.Purge(ctx, lease); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, "billing-2 dropped once the reaper removed its record", func() bool {
			b, err := lb.Balancer("billing")
			return err == nil && len(b.Servers()) == 1
		})
		// The balancer may drop billing-2 first by another path (its
		// connection's disconnect advisory): wait for the reaper's count,
		// the proof of its removal, rather than assume the order.
		testutil.Eventually(t, "the reaper to count its removal", func() bool { return r.Stats().Reaped >= 1 })
		if st := r.Stats(); st.Reaped != 1 || st.Errors != 0 {
			t.Fatalf("reaper stats %+v", st)
		}
		if body, err := get("http://billing/x"); err != nil || body != "billing-1 /x" {
			t.Fatalf("billing after the reaping: %q, %v", body, err)
		}
	})

	// The withdrawal reaches the gateway: the instance is dropped.
	if code := ann.Stop(t, 15*time.Second); code != 0 {
		t.Fatalf("announce exited %d", code)
	}
	testutil.Eventually(t, "orders dropped after its withdrawal", func() bool {
		b, err := lb.Balancer("orders")
		return err == nil && len(b.Servers()) == 0
	})
	if _, err := kv.Get(ctx, instanceKey(t, "orders", "orders-1")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("orders' entry after the withdrawal: %v", err)
	}

	// Neither the announcer nor the gateway was refused anything on the
	// way: their grants are enough. The gateway's refusals, if any, reached
	// its log before the sentinel's.
	if out := ann.Output(); strings.Contains(out, "ermissions violation") || strings.Contains(out, "Permissions Violation") {
		t.Errorf("announce was refused something:\n%s", out)
	}
	lb.Close()
	if err := gwConn.Publish("permtest.sentinel", nil); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the gateway's sentinel refusal", func() bool {
		return strings.Contains(gwLogs.String(), `permtest.sentinel`)
	})
	// Its refusals: the reaper's lock, tried once, and the sentinel.
	logs := gwLogs.String()
	if n := strings.Count(logs, "Permissions Violation"); n != 2 || !strings.Contains(logs, serverlist.ReaperLockKey) {
		t.Errorf("the gateway was refused %d things, want only the reaper's lock and the sentinel:\n%s", n, logs)
	}
}

func withURL(c natsconn.Config, url string) natsconn.Config {
	c.URL = url
	return c
}

func valueOf(e jetstream.KeyValueEntry) string {
	if e == nil {
		return ""
	}
	return string(e.Value())
}
