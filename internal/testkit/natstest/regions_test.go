package natstest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/app/natsaccounts"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// Every region reaches every other region's JetStream through its domain:
// a leaf region the hub's, the hub a leaf region's, and a leaf region
// another leaf region's through the hub. A bucket made in another
// region's domain lives there: that region's own client reads it.
func TestRegionsDomains(t *testing.T) {
	for _, names := range [][]string{{"eu", "us"}, {"eu", "us", "ap"}} {
		t.Run(fmt.Sprint(len(names)), func(t *testing.T) {
			r := natstest.StartRegions(t, names...)
			checkDomains(t, r, names)
		})
	}
}

// The same with pushlb's accounts (WithAdvisories): the leaf nodes link
// the application account.
func TestRegionsDomainsWithAccounts(t *testing.T) {
	names := []string{"eu", "us", "ap"}
	r := natstest.StartRegionsWith(t, []natstest.Option{natstest.WithAdvisories(t, events.DefaultPrefix)}, names...)
	checkDomains(t, r, names)
	leafz, err := r.Server("eu").NATS().Leafz(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leafz.Leafs {
		if l.Account != natsaccounts.Account {
			t.Fatalf("a leaf node links account %q", l.Account)
		}
	}
	if len(leafz.Leafs) != 2 {
		t.Fatalf("the hub has %d leaf nodes", len(leafz.Leafs))
	}
}

func checkDomains(t *testing.T, r *natstest.Regions, names []string) {
	t.Helper()
	ctx := t.Context()
	for _, from := range names {
		nc := r.Connect(t, from)
		for _, to := range names {
			if to == from {
				continue
			}
			js, err := jetstream.NewWithDomain(nc, to)
			if err != nil {
				t.Fatal(err)
			}
			bucket := "from_" + from
			kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
			if err != nil {
				t.Fatalf("%s creates a bucket in %s's domain: %v", from, to, err)
			}
			if _, err := kv.PutString(ctx, "k", from+">"+to); err != nil {
				t.Fatalf("%s puts in %s's domain: %v", from, to, err)
			}
			local, err := jetstream.New(r.Connect(t, to))
			if err != nil {
				t.Fatal(err)
			}
			lkv, err := local.KeyValue(ctx, bucket)
			if err != nil {
				t.Fatalf("%s's bucket %s is not in %s: %v", from, bucket, to, err)
			}
			if e, err := lkv.Get(ctx, "k"); err != nil || string(e.Value()) != from+">"+to {
				t.Fatalf("%s reads %s's put: %v, %v", to, from, e, err)
			}
			if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != from+">"+to {
				t.Fatalf("%s reads its put back from %s's domain: %v, %v", from, to, e, err)
			}
		}
	}
}

// A cut leaf region's JetStream does not answer the hub's clients, nor
// the hub's its clients; both answer their own. After Heal they answer
// each other again.
func TestRegionsCutAndHeal(t *testing.T) {
	r := natstest.StartRegions(t, "eu", "us", "ap")
	ncEU, ncUS := r.Connect(t, "eu"), r.Connect(t, "us")
	euFromUS, _ := jetstream.NewWithDomain(ncUS, "eu")
	usFromEU, _ := jetstream.NewWithDomain(ncEU, "us")
	apFromUS, _ := jetstream.NewWithDomain(ncUS, "ap")
	usLocal, _ := jetstream.New(ncUS)
	answers := func(js jetstream.JetStream) error {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err
	}
	for _, js := range []jetstream.JetStream{euFromUS, usFromEU, apFromUS} {
		if err := answers(js); err != nil {
			t.Fatalf("before the cut: %v", err)
		}
	}

	r.Cut(t, "us")
	cut := time.Now()
	for _, js := range []jetstream.JetStream{euFromUS, usFromEU, apFromUS} {
		// Over the frozen leaf connection a request times out; once the
		// connection is given up, nobody answers.
		if err := answers(js); err == nil {
			t.Fatal("a domain request crossed a cut link")
		}
	}
	if err := answers(usLocal); err != nil {
		t.Fatalf("the cut region's own JetStream: %v", err)
	}
	hub := r.Server("eu").NATS()
	testutil.Eventually(t, "the hub to give up the cut leaf connection", func() bool { return hub.NumLeafNodes() == 1 })
	t.Logf("the cut noticed after %v", time.Since(cut).Round(time.Millisecond))
	if err := answers(euFromUS); err == nil {
		t.Fatal("a domain request crossed a cut link")
	}

	healed := time.Now()
	r.Heal(t, "us")
	t.Logf("the link carried traffic and JetStream requests again %v after Heal", time.Since(healed).Round(time.Millisecond))
	for _, js := range []jetstream.JetStream{euFromUS, usFromEU, apFromUS} {
		if err := answers(js); err != nil {
			t.Fatalf("after Heal: %v", err)
		}
	}
}

// Heal right after Cut, before the pings gave the frozen connection up,
// still returns once the regions are linked again.
func TestRegionsHealBeforeNoticed(t *testing.T) {
	r := natstest.StartRegions(t, "eu", "us")
	r.Cut(t, "us")
	healed := time.Now()
	r.Heal(t, "us")
	t.Logf("linked again %v after Heal", time.Since(healed).Round(time.Millisecond))
}
