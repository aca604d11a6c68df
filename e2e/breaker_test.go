package e2e

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/app/gateway"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
)

// trips returns the breaker trips of service, from the gateway's state.
func trips(g *gateway.Gateway, service string) uint64 {
	for _, s := range g.State().Services {
		if s.Name == service {
			return s.Trips
		}
	}
	return 0
}

// An instance whose port refuses connections trips its breaker under the
// requests the gateway sends it; the page shows it tripped (never "up"),
// and its zone, with no other server, avoided, while the other zone, the
// last one left, is not: pushed, without a reload.
func TestDashboardShowsTrippedAndAvoided(t *testing.T) {
	ctx := browser(t)
	g := startGateway(t, false)
	nc, err := nats.Connect(g.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	dead := testpub.Backend(t, "dead")
	dead.Close() // its port refuses connections from now on
	live := testpub.Backend(t, "live")
	testpub.Announce(t, nc, "pay", "z1", dead)
	testpub.Announce(t, nc, "pay", "z2", live)

	admin := "http://" + g.AdminAddr()
	if err := chromedp.Do(ctx, chromedp.Navigate(admin+"/-/lb")); err != nil {
		t.Fatal(err)
	}
	row := `document.querySelector('tr.instance[data-instance="` + dead.URL + `"]')`
	zone := func(z string) string {
		return `[...document.querySelectorAll("table.zones tr")].find(r => r.cells[0].textContent === "` + z + `")`
	}
	poll(t, ctx, "both instances up", `document.querySelectorAll("tr.instance").length === 2 && `+row+`?.cells[4].textContent === "up" && document.getElementById("status").textContent === "live"`, 10*time.Second)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.noReload = true`)); err != nil {
		t.Fatal(err)
	}

	// Requests through the gateway: those sent to the dead instance fail to
	// connect and are retried on the live one, until the breaker trips.
	proxy := "http://" + g.ProxyAddr() + "/pay/x"
	for i := 0; trips(g, "pay") == 0; i++ {
		if i == 100 {
			t.Fatalf("no breaker trip after %d requests", i)
		}
		resp, err := http.Get(proxy)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d, want the live instance's 200", i, resp.StatusCode)
		}
	}
	tripped := time.Now()
	poll(t, ctx, "the dead instance shown tripped",
		row+`?.cells[4].textContent === "tripped" && `+row+`.cells[4].className === "tripped" && `+row+`.cells[9].textContent.startsWith("open") && window.noReload === true`, time.Second)
	t.Logf("the tripped breaker showed %v after the trip", time.Since(tripped).Round(time.Millisecond))
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](row+`.textContent`))
	if err != nil {
		t.Fatal(err)
	}
	for _, word := range []string{"up", "yes", "alive"} {
		if containsWord(text, word) {
			t.Errorf("the tripped instance's row reads %q: %q", word, text)
		}
	}
	poll(t, ctx, "zone z1 avoided, z2 not", zone("z1")+`?.cells[5].textContent === "avoided" && `+zone("z2")+`?.cells[5].textContent === "no"`, time.Second)
	poll(t, ctx, "the summary naming both", `(s => s.includes("1 tripped") && s.includes("1 zone avoided: z1"))(document.querySelector("#services summary").textContent)`, time.Second)
}

// containsWord reports whether text holds word between non-letters.
func containsWord(text, word string) bool {
	letter := func(b byte) bool { return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' }
	for i := 0; i+len(word) <= len(text); i++ {
		if text[i:i+len(word)] == word && (i == 0 || !letter(text[i-1])) && (i+len(word) == len(text) || !letter(text[i+len(word)])) {
			return true
		}
	}
	return false
}
