package main

import (
	"maps"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestRegionFailover: a gateway in region eu (regionPriority: [us]) over
// instances announced in eu, us and ap (announce -region). Requests go to
// eu's instance; when it leaves (announced offline), to us's; when that
// one crashes (SIGKILL of its announce and its backend closed), to ap's;
// when eu's is announced again, back to eu. Under a steady load, with the
// gateway's retries, no request fails. It logs how long each move took
// after the change, as the requests saw it.
func TestRegionFailover(t *testing.T) {
	g := startConfigured(t, "region: eu\nregionPriority: [us]\n")
	backends := map[string]*httptest.Server{}
	anns := map[string]*testutil.Proc{}
	for _, name := range []string{"eu", "us", "ap"} {
		backends[name] = named(t, name)
		anns[name] = announceHold(t, g, "orders", backends[name].Listener.Addr().String(), "-region", name, "-id", name)
	}
	testutil.Eventually(t, "three regions listed", func() bool { return strings.Count(g.state(t), `"id"`) == 3 })
	if st := g.state(t); !strings.Contains(st, `"region": "us"`) {
		t.Errorf("/-/lb does not show the instances' regions: %s", st)
	}
	if seen := g.reached(t, "/orders/", 50); !maps.Equal(seen, map[string]int{"eu": 50}) {
		t.Fatalf("before any change: %v, want eu alone", seen)
	}

	// A steady load, noting when each region first answered and what
	// failed.
	var (
		mu       sync.Mutex
		first    = map[string]time.Time{}
		failed   atomic.Int64
		requests atomic.Int64
		stop     = make(chan struct{})
		done     sync.WaitGroup
	)
	for range 4 {
		done.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, body, err := g.hit("/orders/")
				requests.Add(1)
				if err != nil || code != 200 {
					failed.Add(1)
					continue
				}
				mu.Lock()
				if _, ok := first[body]; !ok {
					first[body] = time.Now()
				}
				mu.Unlock()
			}
		})
	}
	answered := func(region string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			_, ok := first[region]
			return ok
		}
	}
	since := func(region string, at time.Time) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return first[region].Sub(at).Round(time.Millisecond)
	}

	at := time.Now()
	if code := anns["eu"].Stop(t, exitTimeout); code != 0 {
		t.Fatalf("announce eu exited %d", code)
	}
	testutil.Eventually(t, "us to answer", answered("us"))
	tookUS := since("us", at)

	at = time.Now()
	anns["us"].Kill(t)
	backends["us"].Close()
	testutil.Eventually(t, "ap to answer", answered("ap"))
	tookAP := since("ap", at)

	mu.Lock()
	delete(first, "eu")
	mu.Unlock()
	at = time.Now()
	anns["eu"] = announceHold(t, g, "orders", backends["eu"].Listener.Addr().String(), "-region", "eu", "-id", "eu")
	testutil.Eventually(t, "eu to answer again", answered("eu"))
	back := since("eu", at)
	close(stop)
	done.Wait()

	if seen := g.reached(t, "/orders/", 50); !maps.Equal(seen, map[string]int{"eu": 50}) {
		t.Fatalf("eu back: %v, want eu alone", seen)
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d requests failed", n, requests.Load())
	}
	mu.Lock()
	regions := slices.Sorted(maps.Keys(first))
	mu.Unlock()
	t.Logf("regions answered: %v; eu offline → us answered %v after; us crashed → ap %v after; eu announced again → eu %v after its start; %d requests, %d failed",
		regions, tookUS, tookAP, back, requests.Load(), failed.Load())
}
