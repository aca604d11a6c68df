package e2e

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"

	"github.com/pushlb/pushlb/internal/app/gateway"
	"github.com/pushlb/pushlb/internal/testkit/scale"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// loadFleet registers services x instances (svc-0 … svc-N, instances in
// zones a, b, c) in the gateway's registry and publishes their online
// events, as that many announcers would, and waits until the gateway
// balances all of them. It returns the fleet, its connection and the
// instances, for a test to deregister some.
func loadFleet(t *testing.T, g *gateway.Gateway, services, instances int) (*scale.Fleet, *nats.Conn, []serverlist.Instance) {
	t.Helper()
	nc, err := nats.Connect(g.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f, ins, err := scale.Load(t.Context(), nc, scale.Size{Services: services, Instances: instances, Gateways: 1}, gateway.DefaultConfig().Lease, 1)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "every instance in the gateway", func() bool {
		st := g.State()
		if len(st.Services) != services {
			return false
		}
		for _, s := range st.Services {
			if len(s.Servers) != instances {
				return false
			}
		}
		return true
	})
	return f, nc, ins
}

// visibleJS counts the services the filter leaves shown.
const visibleJS = `[...document.querySelectorAll("#services details.svc")].filter(e => !e.hidden).length`

// filterJS types f in the filter box as one input event and resolves, at
// the first animation frame where the page shows want services, with the
// milliseconds that took.
func filterJS(f string, want int) string {
	return `new Promise(resolve => {
  const box = document.getElementById("filter"), t0 = performance.now();
  box.value = ` + strconv.Quote(f) + `; box.dispatchEvent(new Event("input"));
  const check = () => ` + visibleJS + ` === ` + strconv.Itoa(want) + ` ? resolve(performance.now() - t0) : requestAnimationFrame(check);
  requestAnimationFrame(check);
})`
}

// With 1,000 services of 3 instances, the page renders every service
// collapsed (no instance row built until one is opened), and the filter
// box narrows the list to one service by name.
func TestDashboardWithThousandServices(t *testing.T) {
	const services, instances = 1000, 3
	ctx := browser(t)
	g := startGateway(t, false)
	page := "http://" + g.AdminAddr() + "/-/lb"

	// The page open while the services join: they arrive in updates.
	if err := chromedp.Do(ctx, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the empty page live", `document.getElementById("status").textContent === "live"`, 10*time.Second)
	start := time.Now()
	loadFleet(t, g, services, instances)
	poll(t, ctx, "1,000 services joining the open page", `(n => n.length === 1000 && [...n].every((e, i) => i === 0 || n[i-1].dataset.name < e.dataset.name || n[i-1].dataset.name.length < e.dataset.name.length))(document.querySelectorAll("#services details.svc"))`, 10*time.Second)
	t.Logf("the open page showed the 1,000 services %v after their registration began", time.Since(start).Round(time.Millisecond))
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#services details[open]").length`)); err != nil || n != 0 {
		t.Fatalf("%d services open (%v), want all folded once there are 1,000", n, err)
	}

	// Loaded afresh: the whole state at once.
	start = time.Now()
	if err := chromedp.Do(ctx, chromedp.Navigate(page)); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "1,000 services on the page", `document.querySelectorAll("#services details.svc").length === 1000`, 20*time.Second)
	firstRender := time.Since(start)
	inPage, _ := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`[window.pushlbFirstState || 0, window.pushlbFirstFullRender || 0]`))
	if len(inPage) != 2 {
		inPage = []float64{0, 0}
	}
	t.Logf("%d services x %d instances: rendered %v after the navigation began (in the page: the state parsed %.0f ms, rendered %.0f ms after the navigation start)",
		services, instances, firstRender.Round(time.Millisecond), inPage[0], inPage[1])

	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#services details[open]").length`)); err != nil || n != 0 {
		t.Fatalf("%d services open (%v), want all collapsed", n, err)
	}
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("tr.instance").length`)); err != nil || n != 0 {
		t.Errorf("%d instance rows built (%v), want none while every service is collapsed", n, err)
	}

	// A user types the name: one service left.
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.CSS("#filter"), "svc-500")); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the filter to leave svc-500 alone", visibleJS+` === 1 && [...document.querySelectorAll("#services details.svc")].find(e => !e.hidden).dataset.name === "svc-500"`, 2*time.Second)
	// Opened (a click on its summary line), it shows its instances.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("#services details.svc:not([hidden]) > summary").click(), true`)); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "svc-500's instances", `document.querySelectorAll("#services details[open] tr.instance").length === 3`, 2*time.Second)

	// Timed: clearing the filter, then narrowing again, each as one input.
	all := measure(t, ctx, filterJS("", services))
	one := measure(t, ctx, filterJS("svc-500", 1))
	t.Logf("filter: %.1f ms to show all %d services again, %.1f ms to narrow to one (input to the frame that shows it)", all, services, one)
}

func measure(t *testing.T, ctx context.Context, js string) float64 {
	t.Helper()
	ms, err := chromedp.Run(ctx, chromedp.Evaluate[float64](js, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// With 1,000 services of 6 instances, more than the gateway sends whole,
// the page gets summaries: its folded lines count the servers, and a
// service opened shows its instances, fetched then, and follows them live:
// an instance that leaves loses its row without a reload.
func TestDashboardOpensServiceOnBigGateway(t *testing.T) {
	const services, instances = 1000, 6
	ctx := browser(t)
	g := startGateway(t, false)
	f, nc, ins := loadFleet(t, g, services, instances)
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+g.AdminAddr()+"/-/lb")); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "1,000 services in summaries", `document.querySelectorAll("#services details.svc").length === 1000 && model.services.get("svc-500").summary === true && document.getElementById("status").textContent === "live"`, 20*time.Second)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.noReload = true`)); err != nil {
		t.Fatal(err)
	}
	svc := `document.getElementById("svc-svc-500")`
	poll(t, ctx, "svc-500's line to count 6 servers", svc+`.firstChild.textContent.includes("6 servers (6 up)")`, 2*time.Second)
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("tr.instance").length`)); err != nil || n != 0 {
		t.Fatalf("%d instance rows (%v), want none before a service is opened", n, err)
	}

	start := time.Now()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](svc+`.firstChild.click(), true`)); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "svc-500's 6 instance rows", `document.querySelectorAll("tr.instance").length === 6 && `+svc+`.querySelectorAll("tr.instance").length === 6`, 5*time.Second)
	t.Logf("svc-500 opened: its %d instance rows shown %v after the click", instances, time.Since(start).Round(time.Millisecond))

	gone := ins[500*instances] // instance 0 of svc-500
	start = time.Now()
	if err := f.Deregister(t.Context(), nc, gone); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the row of the instance that left to go", fmt.Sprintf(`(rows => rows.length === 5 && !rows.some(r => r.dataset.instance === %q))([...%s.querySelectorAll("tr.instance")]) && %s.firstChild.textContent.includes("5 servers") && window.noReload === true`, gone.InstanceID, svc, svc), 5*time.Second)
	t.Logf("%s's row went %v after its deregistration", gone.InstanceID, time.Since(start).Round(time.Millisecond))
}
