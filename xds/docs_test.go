package pushlbxds_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	bootstrappb "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
)

// docBlock returns the first fenced block of lang in docs/xds.md.
func docBlock(t *testing.T, lang string) string {
	t.Helper()
	b, err := os.ReadFile("../docs/xds.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```"+lang+"\n")
	if !ok {
		t.Fatalf("docs/xds.md has no %s block", lang)
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("docs/xds.md: the %s block does not end", lang)
	}
	return block
}

// TestDocsBootstrap: the grpc-go bootstrap of docs/xds.md, pointed at a
// server, makes a client in z1 that reaches z1's instance.
func TestDocsBootstrap(t *testing.T) {
	doc := docBlock(t, "json")
	srv := natstest.Start(t)
	c := startClient(t, srv, pushlb.Config{})
	nc := srv.Connect(t)
	z1, z2 := startGRPCServer(t), startGRPCServer(t)
	testpub.AnnounceAddr(t, nc, "orders", "z1", "orders-z1", z1.addr)
	testpub.AnnounceAddr(t, nc, "orders", "z2", "orders-z2", z2.addr)
	_, addr := startXDS(t, c)
	if !strings.Contains(doc, `"127.0.0.1:18000"`) {
		t.Fatalf("the bootstrap does not name 127.0.0.1:18000:\n%s", doc)
	}
	b, err := xds.NewXDSResolverWithConfigForTesting([]byte(strings.ReplaceAll(doc, "127.0.0.1:18000", addr)))
	if err != nil {
		t.Fatalf("docs/xds.md's bootstrap: %v", err)
	}
	conn, err := grpc.NewClient("xds:///orders", grpc.WithResolvers(b), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	onlyReaches(t, conn, "z1's instance", 3, z1.addr)
}

// TestEnvoyBootstrapInDocs: the Envoy bootstrap of docs/xds.md parses as
// envoy.config.bootstrap.v3.Bootstrap and passes the proto validators,
// its typed configs included (no Envoy binary is run here).
func TestEnvoyBootstrapInDocs(t *testing.T) {
	var v any
	if err := yaml.Unmarshal([]byte(docBlock(t, "yaml")), &v); err != nil {
		t.Fatal(err)
	}
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrappb.Bootstrap
	if err := protojson.Unmarshal(j, &bs); err != nil {
		t.Fatalf("docs/xds.md's Envoy bootstrap: %v", err)
	}
	if err := validateDeep(&bs); err != nil {
		t.Fatalf("docs/xds.md's Envoy bootstrap: %v", err)
	}
	if bs.GetDynamicResources().GetCdsConfig().GetAds() == nil || bs.GetNode().GetLocality().GetZone() != "z1" ||
		bs.GetStaticResources().GetClusters()[0].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue() != 18000 {
		t.Fatalf("bootstrap %v", &bs)
	}
}
