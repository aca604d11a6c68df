package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// The binary takes the -http-* flags (here: an idle keep-alive connection
// is closed after -http-idle-timeout) and serves /readyz next to /healthz.
func TestGatewayHTTPFlagsAndReadyz(t *testing.T) {
	g := &gw{proxy: testutil.FreeAddr(t), admin: testutil.FreeAddr(t), nats: testutil.FreeAddr(t)}
	g.Proc = start(t, bin.gateway, "-listen", g.proxy, "-admin", g.admin, "-embedded-nats", g.nats, "-data-dir", t.TempDir(),
		"-http-idle-timeout", "300ms", "-http-read-timeout", "5s", "-http-max-conns", "50")
	var ready struct {
		Ready    bool   `json:"ready"`
		NATS     string `json:"nats"`
		Services int    `json:"services"`
	}
	testutil.Eventually(t, "/readyz", func() bool {
		code, body, err := testutil.Fetch(client, "http://"+g.admin+"/readyz")
		return err == nil && code == 200 && json.Unmarshal([]byte(body), &ready) == nil
	})
	if !ready.Ready || ready.NATS != "connected" {
		t.Fatalf("/readyz: %+v", ready)
	}
	if m := g.metric("pushlb_http_connections_limit"); m != 50 {
		t.Errorf("pushlb_http_connections_limit = %v, want 50", m)
	}

	c, err := net.DialTimeout("tcp", g.proxy, lineTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(lineTimeout))
	br := bufio.NewReader(c)
	fmt.Fprint(c, "GET /nothing/x HTTP/1.1\r\nHost: gw\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Close {
		t.Fatalf("%d %q, close %v; want a kept-alive 404", resp.StatusCode, strings.TrimSpace(string(body)), resp.Close)
	}
	_, err = io.Copy(io.Discard, br)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the idle connection was still open after %v", lineTimeout)
	}
}
