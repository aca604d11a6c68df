package testpub_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/serverlist"
)

func TestAnnounceRegisters(t *testing.T) {
	srv := natstest.Start(t)
	b := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(b.Close)
	testpub.Announce(t, srv.Connect(t), "orders", "z1", b)

	js, _ := jetstream.New(srv.Connect(t))
	reg, err := serverlist.Open(t.Context(), js, serverlist.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	in, err := reg.Get(t.Context(), "orders", b.URL)
	if err != nil {
		t.Fatal(err)
	}
	if in.Zone != "z1" || in.Host != "127.0.0.1" || in.Port == 0 {
		t.Fatalf("registered %+v", in)
	}
}
