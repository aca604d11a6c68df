package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/internal/testkit/testpub"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// sseEvent is one server-sent event read from a stream.
type sseEvent struct{ name, data string }

// openStream opens /-/lb/events and returns its events, read by a
// goroutine that ends with the response body.
func openStream(t *testing.T, g *Gateway) (<-chan sseEvent, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+g.AdminAddr()+"/-/lb/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		resp.Body.Close()
		t.Fatalf("/-/lb/events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ch := make(chan sseEvent, 64)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 16<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[len("data: "):]
			case line == "" && ev.name != "":
				select {
				case ch <- ev:
				case <-ctx.Done():
					return
				}
				ev = sseEvent{}
			}
		}
	}()
	return ch, resp
}

// nextEvent waits for the next event named name, skipping others.
func nextEvent(t *testing.T, ch <-chan sseEvent, name string, until func(data string) bool) string {
	t.Helper()
	timeout := time.After(testutil.DefaultTimeout)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("stream ended waiting for %q", name)
			}
			if ev.name == name && (until == nil || until(ev.data)) {
				return ev.data
			}
		case <-timeout:
			t.Fatalf("no %q event", name)
		}
	}
}

// The stream starts with the whole state, then pushes every list change:
// an instance that joins, one that leaves, each in the timeline with its
// source (and an event's lag).
func TestEventsStreamPushesListChanges(t *testing.T) {
	g := startGateway(t, testConfig(t))
	ch, _ := openStream(t, g)
	var st struct {
		Services   []ServiceState
		Timeline   []TimelineEntry
		Subscriber json.RawMessage
	}
	if err := json.Unmarshal([]byte(nextEvent(t, ch, "state", nil)), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Services) != 0 || st.Subscriber == nil {
		t.Fatalf("first state: %+v", st)
	}

	p := announce(t, g, "orders", "z1", testpub.Backend(t, "a"))
	var u update
	nextEvent(t, ch, "update", func(data string) bool {
		u = update{}
		json.Unmarshal([]byte(data), &u)
		return len(u.Services) == 1 && len(u.Services[0].Servers) == 1
	})
	if s := u.Services[0].Servers[0]; s.Status != "up" || s.Zone != "z1" || u.Services[0].Name != "orders" {
		t.Fatalf("joined: %+v", u.Services[0])
	}
	if err := p.Withdraw(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, ch, "update", func(data string) bool {
		u = update{}
		json.Unmarshal([]byte(data), &u)
		return len(u.Services) == 1 && len(u.Services[0].Servers) == 0
	})
	var offline *TimelineEntry
	for i, c := range g.State().Timeline {
		if c.Change == "offline" && c.Service == "orders" {
			offline = &g.State().Timeline[i]
		}
	}
	// The withdrawal's offline event and its record's removal race: the
	// first to arrive is the source, an event with its lag.
	switch {
	case offline == nil:
		t.Fatalf("no offline in the timeline: %+v", g.State().Timeline)
	case offline.Source == SourceEvent && (offline.LagMs == nil || *offline.LagMs < 0):
		t.Fatalf("an event's change without its lag: %+v", *offline)
	case offline.Source == SourceRegistry && offline.LagMs != nil:
		t.Fatalf("a registry change with a lag: %+v", *offline)
	case offline.Source != SourceEvent && offline.Source != SourceRegistry:
		t.Fatalf("offline source %q, want event or registry", offline.Source)
	}
}

// The JSON uses camelCase keys throughout, the nested stats included.
func TestStateJSONIsCamelCase(t *testing.T) {
	g := startGateway(t, testConfig(t))
	announce(t, g, "orders", "z1", testpub.Backend(t, "a"))
	testutil.Eventually(t, "the server", func() bool { s := g.State().Services; return len(s) == 1 && len(s[0].Servers) == 1 })
	_, body := testutil.Get(t, "http://"+g.AdminAddr()+"/-/lb")
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				// Zone names, metadata keys and drop reasons are values, not field names.
				if !strings.HasSuffix(path, ".zones") && !strings.HasSuffix(path, ".metadata") && !strings.HasSuffix(path, ".dropped") &&
					(k[0] < 'a' || k[0] > 'z') {
					t.Errorf("%s.%s is not camelCase", path, k)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range v {
				walk(path+"[]", e)
			}
		}
	}
	walk("", v)
	for _, k := range []string{`"received"`, `"hits"`, `"instances"`, `"timeline"`, `"status": "up"`, `"pickShare"`} {
		if !strings.Contains(body, k) {
			t.Errorf("/-/lb lacks %s", k)
		}
	}
}

// A stream that does not keep up is dropped; the others, and the gateway,
// go on.
func TestSlowStreamIsDropped(t *testing.T) {
	d := newDashboard(&Gateway{})
	slow, fast := d.subscribe(), d.subscribe()
	for i := range streamBuffer + 1 {
		d.broadcast([]byte("x"))
		if i < streamBuffer {
			<-fast.ch
		}
	}
	select {
	case <-slow.dropped:
	default:
		t.Fatal("the slow stream was not dropped")
	}
	select {
	case <-fast.dropped:
		t.Fatal("the stream that kept up was dropped")
	default:
	}
	d.mu.Lock()
	_, slowIn := d.streams[slow]
	n := len(d.streams)
	d.mu.Unlock()
	if slowIn || n != 1 {
		t.Fatalf("streams left: %d, slow one in: %v", n, slowIn)
	}
}

// Streams beyond the limit are refused with 503; one that ends frees its
// place.
func TestStreamLimit(t *testing.T) {
	g := startGateway(t, testConfig(t))
	g.dash.mu.Lock()
	g.dash.maxStreams = 1
	g.dash.mu.Unlock()
	ch, first := openStream(t, g)
	nextEvent(t, ch, "state", nil)
	resp, err := http.Get("http://" + g.AdminAddr() + "/-/lb/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("second stream: %d, want 503", resp.StatusCode)
	}
	first.Body.Close()
	testutil.Eventually(t, "the first stream's place freed", func() bool {
		g.dash.mu.Lock()
		defer g.dash.mu.Unlock()
		return len(g.dash.streams) == 0
	})
	ch, _ = openStream(t, g)
	nextEvent(t, ch, "state", nil)
}

// Shutdown ends the open streams at once instead of waiting for them until
// its timeout; the heartbeat keeps an idle stream talking.
func TestShutdownEndsStreams(t *testing.T) {
	g := startGateway(t, testConfig(t))
	g.dash.heartbeat = 10 * time.Millisecond // read by the handler, set before the stream opens
	_, resp := openStream(t, g)
	// Read the raw stream up to a heartbeat comment.
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("before a heartbeat: %v", err)
		}
		if strings.HasPrefix(line, ": heartbeat") {
			break
		}
	}
	done := make(chan error, 1)
	go func() { done <- g.Shutdown(context.Background()) }()
	if _, err := io.Copy(io.Discard, r); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Logf("stream ended with %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(g.cfg.ShutdownTimeout / 2):
		t.Fatal("shutdown waits for the event stream")
	}
}

// The gateway's zone is its own, or else the one a .properties file sets
// for the balancer defaults.
func TestZoneFromProperties(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lb.properties")
	os.WriteFile(path, []byte("@zone=eu-west-1a\n"), 0o600)
	cfg, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{cfg: cfg}
	g.dash = newDashboard(g)
	if z := g.State().Zone; z != "eu-west-1a" {
		t.Fatalf("zone %q, want the .properties file's", z)
	}
	g.cfg.Zone = "own"
	if z := g.State().Zone; z != "own" {
		t.Fatalf("zone %q, want the gateway's own", z)
	}
}

func TestMarkAvoided(t *testing.T) {
	th := balancer.ZoneAvoidanceConfig{TriggeringLoadPerServer: 0.2, BlackoutPercentage: 0.99999}
	for _, tc := range []struct {
		name  string
		zones map[string]ZoneState
		want  []string
	}{
		{"idle", map[string]ZoneState{"a": {Instances: 2}, "b": {Instances: 1}}, nil},
		{"loaded", map[string]ZoneState{"a": {Instances: 2, LoadPerServer: 0.5}, "b": {Instances: 1, LoadPerServer: 0.1}}, []string{"a"}},
		{"blacked out", map[string]ZoneState{"a": {Instances: 2, Tripped: 2}, "b": {Instances: 1}, "c": {Instances: 1, LoadPerServer: 0.1}}, []string{"a", "c"}},
		// The balancer never drops the last zone left, nor avoids zones when none is left.
		{"last zone left", map[string]ZoneState{"a": {Instances: 1, Tripped: 1, LoadPerServer: -1}, "b": {Instances: 1, LoadPerServer: 0.5}}, []string{"a"}},
		{"all blacked out", map[string]ZoneState{"a": {Instances: 1, Tripped: 1, LoadPerServer: -1}, "b": {Instances: 2, Tripped: 2, LoadPerServer: -1}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			markAvoided(tc.zones, th)
			var got []string
			for _, z := range []string{"a", "b", "c"} {
				if tc.zones[z].Avoided {
					got = append(got, z)
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("avoided %v, want %v", got, tc.want)
			}
		})
	}
}
