package testenv

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestBinaries builds (or finds cached) kube-apiserver and etcd and checks
// that they are the versions asked for. PUSHLB_K8S_CACHE pointed at an
// empty directory makes it exercise the build.
func TestBinaries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	apiserver, etcdPath, err := Binaries(ctx, t.Logf)
	if err != nil {
		testutil.Missing(t, "kube-apiserver or etcd could not be built: %v", err)
	}
	for _, c := range []struct{ path, flag, want string }{
		{apiserver, "--version", "Kubernetes " + KubernetesVersion},
		{etcdPath, "--version", "etcd Version: " + strings.TrimPrefix(EtcdVersion, "v")},
	} {
		out, err := exec.CommandContext(ctx, c.path, c.flag).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", c.path, c.flag, err, out)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("%s %s: %q, want it to contain %q", c.path, c.flag, out, c.want)
		}
	}
}
