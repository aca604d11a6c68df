package natsproc_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// TestBucketStaysInItsRegionsCluster: a supercluster of a one-server
// cluster (eu) and a three-server one (us). A registry opened from eu's
// server goes into eu's cluster, with the one replica it can place there:
// JetStream, asked for three replicas without a placement, would put the
// bucket in us's cluster (another region), and eu's registry would then
// depend on us.
func TestBucketStaysInItsRegionsCluster(t *testing.T) {
	type node struct{ name, cluster, client, route, gw string }
	nodes := []*node{{name: "eu-1", cluster: "eu"}, {name: "us-1", cluster: "us"}, {name: "us-2", cluster: "us"}, {name: "us-3", cluster: "us"}}
	for _, n := range nodes {
		n.client, n.route, n.gw = testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	}
	for _, n := range nodes {
		var routes []string
		for _, o := range nodes {
			if o.cluster == n.cluster {
				routes = append(routes, fmt.Sprintf("%q", "nats-route://"+o.route))
			}
		}
		conf := fmt.Sprintf("server_name: %s\nlisten: %s\njetstream { store_dir: %q }\n"+
			"cluster { name: %s, listen: %s, routes: [%s] }\n"+
			"gateway { name: %s, listen: %s, gateways: [ {name: eu, urls: [\"nats://%s\"]}, {name: us, urls: [\"nats://%s\"]} ] }\n",
			n.name, n.client, t.TempDir(), n.cluster, n.route, strings.Join(routes, ","), n.cluster, n.gw, nodes[0].gw, nodes[1].gw)
		path := filepath.Join(t.TempDir(), "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		testutil.StartCmd(t, exec.Command(bin, "-c", path))
	}
	var nc *nats.Conn
	testutil.EventuallyWithin(t, time.Minute, "a connection to eu-1", func() bool {
		var err error
		nc, err = nats.Connect("nats://" + nodes[0].client)
		return err == nil
	})
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The meta group of four servers elects its leader first.
	testutil.EventuallyWithin(t, 2*time.Minute, "eu's registry opened", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := serverlist.Open(ctx, js, serverlist.RegistryConfig{Prefix: "eu.lb"})
		return err == nil
	})
	st, err := js.Stream(t.Context(), "KV_pushlb_eu_lb")
	if err != nil {
		t.Fatal(err)
	}
	info := st.CachedInfo()
	if info.Cluster == nil || info.Cluster.Name != "eu" || info.Config.Replicas != 1 {
		t.Fatalf("eu's registry placed in cluster %+v with %d replicas, want eu's with 1", info.Cluster, info.Config.Replicas)
	}
}
