package convergence_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pushlb/pushlb/convergence"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, natstest.IgnoreServerGoroutines()...)
}

// source is a gateway's applied revisions, set by the test.
type source struct {
	mu sync.Mutex
	m  map[string]convergence.Applied
}

func (s *source) set(service string, rev uint64, digest string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]convergence.Applied{}
	}
	s.m[service] = convergence.Applied{Revision: rev, Digest: digest, At: time.Now()}
}

func (s *source) get() map[string]convergence.Applied {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]convergence.Applied, len(s.m))
	for k, v := range s.m {
		out[k] = v
	}
	return out
}

// behind returns the gateways the view lists behind on service.
func behind(v convergence.View, service string) []string {
	var out []string
	for _, sv := range v.Services {
		if sv.Name == service {
			for _, b := range sv.Behind {
				out = append(out, b.Gateway)
			}
		}
	}
	return out
}

// TestViewerTellsWhoIsBehind: two gateways report; when one applies a
// newer revision of a service, the other is listed behind on it (not on
// the service it does not follow) until it applies it too. A newer
// revision of the same list (lease refreshes) leaves nobody behind.
func TestViewerTellsWhoIsBehind(t *testing.T) {
	srv := natstest.Start(t)
	v, err := convergence.NewViewer(srv.Connect(t), convergence.ViewerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Start(); err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	var a, b source
	a.set("orders", 10, "list-1")
	b.set("orders", 10, "list-1")
	b.set("billing", 5, "list-b")
	for id, s := range map[string]*source{"gw-a": &a, "gw-b": &b} {
		r, err := convergence.NewReporter(srv.Connect(t), convergence.ReporterConfig{ID: id, Interval: convergence.MinInterval, Source: s.get})
		if err != nil {
			t.Fatal(err)
		}
		r.Start()
		defer r.Close()
	}
	testutil.Eventually(t, "both gateways in the view", func() bool { return len(v.View().Gateways) == 2 })
	a.set("orders", 12, "list-2")
	testutil.Eventually(t, "gw-b behind on orders", func() bool { return strings.Join(behind(v.View(), "orders"), ",") == "gw-b" })
	view := v.View()
	if got := behind(view, "billing"); len(got) != 0 {
		t.Fatalf("behind on billing, which gw-a does not follow: %v", got)
	}
	for _, sv := range view.Services {
		if sv.Name == "orders" && (sv.Revision != 12 || sv.Gateways != 2 || sv.Behind[0].Revision != 10) {
			t.Fatalf("orders in the view: %+v", sv)
		}
	}
	b.set("orders", 12, "list-2")
	testutil.Eventually(t, "gw-b caught up", func() bool { return len(behind(v.View(), "orders")) == 0 })

	a.set("orders", 15, "list-2")
	testutil.Eventually(t, "gw-a's refreshed revision in the view", func() bool {
		for _, sv := range v.View().Services {
			if sv.Name == "orders" {
				return sv.Revision == 15
			}
		}
		return false
	})
	if got := behind(v.View(), "orders"); len(got) != 0 {
		t.Fatalf("behind with the same list at an older revision: %v", got)
	}
	if st := v.Stats(); st.Dropped != 0 || st.Received < 4 {
		t.Fatalf("viewer stats %+v", st)
	}
}

// TestDecodeChecksReports: a report must come on its gateway's subject,
// in this version, with valid service names and within the size limit.
func TestDecodeChecksReports(t *testing.T) {
	ok := `{"v":1,"gateway":"gw-1","at":"2026-12-05T10:00:00Z","seq":1,"services":{"orders":{"revision":3,"at":"2026-12-05T10:00:00Z"}}}`
	if r, err := convergence.Decode("lb", "lb.report.gw-1", []byte(ok)); err != nil || r.Services["orders"].Revision != 3 {
		t.Fatalf("a valid report: %+v, %v", r, err)
	}
	for name, c := range map[string]struct{ subject, data string }{
		"another gateway's subject": {"lb.report.gw-2", ok},
		"another prefix":            {"other.report.gw-1", ok},
		"version":                   {"lb.report.gw-1", strings.Replace(ok, `"v":1`, `"v":2`, 1)},
		"no seq":                    {"lb.report.gw-1", strings.Replace(ok, `"seq":1`, `"seq":0`, 1)},
		"bad service":               {"lb.report.gw-1", strings.Replace(ok, `"orders"`, `"a.b"`, 1)},
		"not JSON":                  {"lb.report.gw-1", "{"},
		"too large":                 {"lb.report.gw-1", ok + strings.Repeat(" ", convergence.MaxReportSize)},
	} {
		if _, err := convergence.Decode("lb", c.subject, []byte(c.data)); !errors.Is(err, convergence.ErrInvalidReport) {
			t.Errorf("%s: %v, want ErrInvalidReport", name, err)
		}
	}
}

// TestProtocolDocReport: the report of docs/protocol.md, section 8,
// decodes, on its gateway's subject.
func TestProtocolDocReport(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "## 8. Convergence reports")
	if !ok {
		t.Fatal("docs/protocol.md has no section 8. Convergence reports")
	}
	_, block, _ := strings.Cut(section, "```json\n")
	payload, _, _ := strings.Cut(block, "```")
	r, err := convergence.Decode("lb", convergence.Subject("lb", "gw-1"), []byte(payload))
	if err != nil || r.Services["orders"].Revision != 1234 {
		t.Fatalf("the documented report: %+v, %v", r, err)
	}
}

// TestListDigestIsTheDocumentedSum: ListDigest is FNV-1a 64 over each
// instance's ID length (8 bytes big-endian), ID and incarnation (8 bytes
// big-endian), as docs/protocol.md §8 says; lists that differ in an ID,
// an incarnation or a split between IDs differ.
func TestListDigestIsTheDocumentedSum(t *testing.T) {
	type inst struct {
		id  string
		inc int64
	}
	sum := func(list ...inst) (string, string) {
		d := convergence.NewListDigest()
		h := fnv.New64a()
		for _, in := range list {
			d.Add(in.id, in.inc)
			h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(in.id))))
			h.Write([]byte(in.id))
			h.Write(binary.BigEndian.AppendUint64(nil, uint64(in.inc)))
		}
		return d.Sum(), fmt.Sprintf("%016x", h.Sum64())
	}
	lists := [][]inst{
		nil,
		{{"a", 1}},
		{{"a", 2}},
		{{"ab", 1}},
		{{"a", 1}, {"b", 1}},
		{{"a", 1}, {"b", -1}},
	}
	seen := map[string]int{}
	for i, l := range lists {
		got, want := sum(l...)
		if got != want {
			t.Errorf("list %d: %s, want %s", i, got, want)
		}
		if j, ok := seen[got]; ok {
			t.Errorf("lists %d and %d have the same digest %s", j, i, got)
		}
		seen[got] = i
	}
}
