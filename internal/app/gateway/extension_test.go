package gateway

import (
	"context"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pushlb/pushlb"
)

// recordingExt is an Extension that records what the gateway did with it.
type recordingExt struct {
	startErr error
	client   *pushlb.Client
	order    *[]string
	name     string
}

func (x *recordingExt) Name() string                   { return x.name }
func (x *recordingExt) RegisterFlags(fs *flag.FlagSet) {}
func (x *recordingExt) Start(_ context.Context, c *pushlb.Client, _ zerolog.Logger) error {
	*x.order = append(*x.order, "start "+x.name)
	x.client = c
	return x.startErr
}
func (x *recordingExt) Stop(context.Context) error {
	*x.order = append(*x.order, "stop "+x.name)
	return nil
}

func TestExtensionsStartAfterTheClientAndStopInReverse(t *testing.T) {
	var order []string
	a, b := &recordingExt{name: "a", order: &order}, &recordingExt{name: "b", order: &order}
	g, err := New(testConfig(t), zerolog.Nop(), a, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if a.client == nil || a.client != b.client {
		t.Fatal("the extensions did not get the gateway's client")
	}
	if a.client.Stats().Registry.Syncs == 0 {
		t.Fatal("the client an extension gets has not loaded the registry")
	}
	g.Shutdown(context.Background())
	if got := strings.Join(order, ", "); got != "start a, start b, stop b, stop a" {
		t.Fatalf("order: %s", got)
	}
}

func TestExtensionThatFailsToStartStopsTheGateway(t *testing.T) {
	var order []string
	boom := errors.New("boom")
	a, b := &recordingExt{name: "a", order: &order}, &recordingExt{name: "b", order: &order, startErr: boom}
	g, err := New(testConfig(t), zerolog.Nop(), a, b)
	if err != nil {
		t.Fatal(err)
	}
	err = g.Start(t.Context())
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "gateway: b:") {
		t.Fatalf("Start: %v, want boom named after the extension", err)
	}
	// The one that started is stopped; the one that failed is not.
	if got := strings.Join(order, ", "); got != "start a, start b, stop a" {
		t.Fatalf("order: %s", got)
	}
}
