package natsproc_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/app/natsaccounts"
	"github.com/pushlb/pushlb/internal/testkit/natsproc"
)

// Each region reaches the others' JetStream through their domains, the
// two leaf regions each other's through the hub; a region cut off
// answers only its own clients until Heal.
func TestRegions(t *testing.T) {
	r := natsproc.StartRegions(t, bin, "eu", "us", "ap")
	ctx := t.Context()
	for _, name := range r.Names() {
		js, err := jetstream.New(r.Connect(t, name))
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "reg_" + name})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.PutString(ctx, "where", name); err != nil {
			t.Fatal(err)
		}
	}
	remote := func(from, to string) jetstream.KeyValue {
		t.Helper()
		js, err := jetstream.NewWithDomain(r.Connect(t, from), to)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(ctx, "reg_"+to)
		if err != nil {
			t.Fatalf("%s opens %s's bucket: %v", from, to, err)
		}
		return kv
	}
	for _, from := range r.Names() {
		for _, to := range r.Names() {
			if e, err := remote(from, to).Get(ctx, "where"); err != nil || string(e.Value()) != to {
				t.Fatalf("%s reads %s's bucket: %v, %v", from, to, e, err)
			}
		}
	}

	euFromUS := remote("us", "eu")
	get := func(kv jetstream.KeyValue) error {
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := kv.Get(ctx, "where")
		return err
	}
	r.Cut(t, "us")
	if err := get(euFromUS); err == nil {
		t.Fatal("us read eu's bucket over a cut link")
	}
	if err := get(remote("us", "us")); err != nil {
		t.Fatalf("us reads its own bucket during the cut: %v", err)
	}
	healed := time.Now()
	r.Heal(t, "us")
	t.Logf("linked again %v after Heal", time.Since(healed).Round(time.Millisecond))
	if err := get(euFromUS); err != nil {
		t.Fatalf("us reads eu's bucket after Heal: %v", err)
	}
}

// With pushlb's accounts the leaf nodes link the application account.
func TestRegionsWithAccounts(t *testing.T) {
	accounts, err := natsaccounts.Config(events.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	r := natsproc.StartRegionsWith(t, bin, natsproc.RegionsConfig{Extra: accounts, Account: natsaccounts.Account}, "eu", "us")
	js, err := jetstream.NewWithDomain(r.Connect(t, "us"), "eu")
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.AccountInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Domain != "eu" {
		t.Fatalf("domain %q", info.Domain)
	}
}
