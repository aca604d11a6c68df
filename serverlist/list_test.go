package serverlist_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/serverlist"
)

// TestListDuringARewrite: a record rewritten while List runs is listed
// once, old or new. nats-server can leave a subject being rewritten out of
// a watch's initial values (about 1 % of lists here); List then reads the
// keys the stream holds that the watch did not give.
func TestListDuringARewrite(t *testing.T) {
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := serverlist.Open(t.Context(), js, serverlist.RegistryConfig{Bucket: "rewrite"})
	if err != nil {
		t.Fatal(err)
	}
	rev := uint64(0)
	for i := range 5 {
		r, err := reg.Create(t.Context(), serverlist.Instance{Service: "web", InstanceID: fmt.Sprint("i", i), Host: "127.0.0.1", Port: 8000 + i, Incarnation: 1})
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			rev = r
		}
	}
	for n := range 400 {
		done := make(chan error, 1)
		go func() {
			r, err := reg.Update(context.Background(), serverlist.Instance{Service: "web", InstanceID: "i2", Host: "127.0.0.1", Port: 8002, Incarnation: int64(n + 2)}, rev)
			rev = r
			done <- err
		}()
		list, err := reg.List(t.Context(), "web")
		if uerr := <-done; uerr != nil {
			t.Fatal(uerr)
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 5 {
			t.Fatalf("list %d during a rewrite of i2: %d records, want 5: %+v", n, len(list), list)
		}
	}
}
