package natsproc_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natsproc"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// The shipped two-region configurations (docs/multiregion.md).
const multiregion = "../../../examples/nats-server/multiregion/"

// startExample starts nats-server with the example file name
// (natsproc.StartExample) and returns its client URL.
func startExample(t *testing.T, name string, subs ...string) string {
	t.Helper()
	url, _ := natsproc.StartExample(t, bin, multiregion+name, subs...)
	return url
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// The leaf-node variant: a bucket in each region's domain, written there,
// is read from the other region through the domain.
func TestExampleLeafNodeRegions(t *testing.T) {
	leaf := testutil.FreeAddr(t)
	eu := startExample(t, "hub-eu.conf", "0.0.0.0:7422", leaf, "/var/lib/nats/eu", t.TempDir())
	us := startExample(t, "leaf-us.conf", "hub-eu.example.net:7422", leaf, "/var/lib/nats/us", t.TempDir())
	natstest.WaitDomainsLinked(t, time.Minute, natstest.Domain{Name: "eu", URL: eu}, natstest.Domain{Name: "us", URL: us})
	ctx := t.Context()
	urls := map[string]string{"eu": eu, "us": us}
	for region, other := range map[string]string{"eu": "us", "us": "eu"} {
		js, err := jetstream.New(connect(t, urls[region]))
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pushlb_lb"})
		if err != nil {
			t.Fatalf("the registry bucket in %s: %v", region, err)
		}
		if _, err := kv.PutString(ctx, "svc.i1", "in "+region); err != nil {
			t.Fatal(err)
		}
		remote, err := jetstream.NewWithDomain(connect(t, urls[other]), region)
		if err != nil {
			t.Fatal(err)
		}
		rkv, err := remote.KeyValue(ctx, "pushlb_lb")
		if err != nil {
			t.Fatalf("%s opens %s's bucket: %v", other, region, err)
		}
		if e, err := rkv.Get(ctx, "svc.i1"); err != nil || string(e.Value()) != "in "+region {
			t.Fatalf("%s reads %s's bucket: %v, %v", other, region, e, err)
		}
	}
}

// The supercluster variant: one JetStream, each region's bucket named
// after it and placed in its cluster, read from the other region.
func TestExampleSuperclusterRegions(t *testing.T) {
	sc := natsproc.StartSupercluster(t, bin, multiregion)
	urls := map[string]string{"eu": sc.URL("eu"), "us": sc.URL("us")}
	ctx := t.Context()
	for region, other := range map[string]string{"eu": "us", "us": "eu"} {
		js, err := jetstream.New(connect(t, urls[region]))
		if err != nil {
			t.Fatal(err)
		}
		bucket := "pushlb_lb_" + region
		var kv jetstream.KeyValue
		// The meta group needs both servers: it may not be up yet.
		testutil.EventuallyWithin(t, time.Minute, "the bucket "+bucket, func() bool {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Placement: &jetstream.Placement{Cluster: region}})
			return err == nil
		})
		if _, err := kv.PutString(ctx, "svc.i1", "in "+region); err != nil {
			t.Fatal(err)
		}
		s, err := js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Cluster; c == nil || c.Name != region {
			t.Fatalf("%s placed in %+v", bucket, c)
		}
		jsOther, err := jetstream.New(connect(t, urls[other]))
		if err != nil {
			t.Fatal(err)
		}
		rkv, err := jsOther.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatalf("%s opens %s: %v", other, bucket, err)
		}
		if e, err := rkv.Get(ctx, "svc.i1"); err != nil || string(e.Value()) != "in "+region {
			t.Fatalf("%s reads %s: %v, %v", other, bucket, e, err)
		}
	}
}
