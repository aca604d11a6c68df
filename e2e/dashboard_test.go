package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/rs/zerolog"

	pushlb "github.com/pushlb/pushlb"
	"github.com/pushlb/pushlb/internal/app/gateway"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// chromium returns the browser to drive: $CHROMIUM, or the first of the
// usual names on the PATH.
func chromium(t *testing.T) string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testutil.Missing(t, "no Chromium installed (apt-get install chromium, or set CHROMIUM): the dashboard's browser test needs it")
	return ""
}

// browser starts headless Chromium with the flags this machine needs (no
// sandbox as root, no network of its own) and a fresh profile.
func browser(t *testing.T) context.Context {
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profileDir(t)),
		chromedp.WindowSize(1400, 1100),
	)
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	// The browser lives as long as the context of its first action: no
	// timeout there; the test's own deadline bounds it.
	start := ctx
	if err := chromedp.Do(start); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", chromium(t), err)
	}
	return ctx
}

// profileDir is a fresh profile directory, removed with retries after the
// test: Chromium's child processes may still write in it for a moment after
// the browser stops.
func profileDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "pushlb-e2e-chromium")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.RemoveAll(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return dir
}

// startGateway starts a gateway with an embedded NATS server, in demo
// mode (three demo backends) when demo is set. It follows every service,
// as a dashboard of the whole fleet does: the pages are read before any
// request.
func startGateway(t *testing.T, demo bool) *gateway.Gateway {
	cfg := gateway.DefaultConfig()
	cfg.Follow = pushlb.FollowAll
	cfg.Listen, cfg.Admin, cfg.EmbeddedNATS = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Demo = demo
	g, err := gateway.New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown(context.Background()) })
	return g
}

func post(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, body)
	}
}

// rowJS counts the instance rows of the demo backend name (its metadata
// reads name=<name>).
func rowJS(name string) string {
	return fmt.Sprintf(`[...document.querySelectorAll("tr.instance")].filter(r => r.textContent.includes("name=%s")).length`, name)
}

// poll waits, with a bounded poll of the DOM every 10 ms, until expr is
// truthy, and returns how long that took.
func poll(t *testing.T, ctx context.Context, what, expr string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(10*time.Millisecond), chromedp.WithPollingTimeout(within))); err != nil {
		html, _ := chromedp.Run(ctx, chromedp.OuterHTML("body"))
		t.Fatalf("%s: not within %v (%v); page:\n%.3000s", what, within, err, html)
	}
	return time.Since(start)
}

// The dashboard follows the demo backends without a reload: a stopped
// backend's row goes within a second, a started one's comes back, and the
// timeline names both changes.
func TestDashboardFollowsListChanges(t *testing.T) {
	ctx := browser(t)
	g := startGateway(t, true)
	admin := "http://" + g.AdminAddr()
	if err := chromedp.Do(ctx, chromedp.Navigate(admin+"/-/lb")); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the three demo backends", `document.querySelectorAll("tr.instance").length === 3 && document.getElementById("status").textContent === "live"`, 20*time.Second)
	// A marker that a reload would lose.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.noReload = true`)); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	post(t, admin+"/-/demo/stop/demo-2")
	poll(t, ctx, "demo-2's row to go", rowJS("demo-2")+" === 0 && window.noReload === true", time.Second)
	gone := time.Since(start)
	t.Logf("demo-2's row went %v after the stop request", gone)
	poll(t, ctx, "the timeline's offline entry", `[...document.querySelectorAll("#timeline tbody tr")].some(r => r.cells.length > 4 && r.cells[3].textContent === "offline" && r.cells[4].textContent === "event")`, time.Second)

	start = time.Now()
	post(t, admin+"/-/demo/start/demo-2")
	poll(t, ctx, "demo-2's row to come back", rowJS("demo-2")+" === 1 && window.noReload === true", time.Second)
	t.Logf("demo-2's row came back %v after the start request", time.Since(start))

	if path := os.Getenv("PUSHLB_SCREENSHOT"); path != "" {
		screenshot(t, ctx, g, path)
	}
}

// screenshot sends some requests through the gateway, so that the share
// of picks shows, and saves the page as a PNG.
func screenshot(t *testing.T, ctx context.Context, g *gateway.Gateway, path string) {
	for range 60 {
		resp, err := http.Get("http://" + g.ProxyAddr() + "/demo/hello")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// The request counters are pushed every 2 s: wait for them on the page.
	poll(t, ctx, "the requests on the page", `[...document.querySelectorAll("tr.instance")].reduce((n, r) => n + Number(r.cells[6].textContent), 0) >= 60`, 10*time.Second)
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot saved to %s (%d bytes)", path, len(png))
}
