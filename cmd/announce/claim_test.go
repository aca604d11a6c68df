package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushlb/pushlb/events"
	"github.com/pushlb/pushlb/internal/testkit/natstest"
	"github.com/pushlb/pushlb/internal/testkit/testutil"
)

// TestLiveDuplicateRefusedByItsProbe: a second announce for an ID that a
// live announce holds at another address is refused because the holder
// answers there, not because its lease was renewed: with a one-hour lease
// the holder renews nothing during the test, and the claim's watch would
// last half an hour. It exits 1 with one error line that says what holds
// the ID, where, that it answers, and what to do; the record and its lease
// are untouched.
func TestLiveDuplicateRefusedByItsProbe(t *testing.T) {
	t.Parallel()
	w := newWorldTTL(t, natstest.Start(t), time.Hour)
	addr1, addr2 := testutil.FreeAddr(t), testutil.FreeAddr(t)
	start(t, backendBin, "-addr", addr1).WaitFor(t, "listening on", lineTimeout)
	start(t, backendBin, "-addr", addr2).WaitFor(t, "listening on", lineTimeout)
	orig := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-id", "shared", "-addr", addr1)
	expectKind(t, w.next(t), events.Online, "shared")
	held, err := w.reg.GetEntry(testCtx(t), "orders", "shared")
	if err != nil {
		t.Fatal(err)
	}
	lease, err := w.reg.LeaseRevision(testCtx(t), "orders", "shared")
	if err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	dup := announce(t, "-nats", w.srv.URL(), "-service", "orders", "-id", "shared", "-addr", addr2)
	if code := dup.Wait(t, exitTimeout); code != 1 {
		t.Fatalf("duplicate: exit status %d, want 1; stderr:\n%s", code, dup.Stderr())
	}
	took := time.Since(began) // a figure for the docs, not asserted
	lines := logLines(t, dup)
	var refusals []map[string]any
	for _, l := range lines {
		if l["level"] == "error" {
			refusals = append(refusals, l)
		}
		if msg, _ := l["message"].(string); strings.Contains(msg, "watching it") {
			t.Errorf("the duplicate watched the record: %v", l)
		}
	}
	if len(refusals) != 1 {
		t.Fatalf("%d error lines, want the one refusal:\n%s", len(refusals), dup.Stderr())
	}
	line := fmt.Sprint(refusals[0]["error"], " ", refusals[0]["message"])
	for _, want := range []string{"in use by another live process", "answers", addr1, "-replace"} {
		if !strings.Contains(line, want) {
			t.Errorf("the refusal does not say %q: %s", want, line)
		}
	}
	t.Logf("refusal: %s", line)
	first, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(lines[0]["time"]))
	last, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(refusals[0]["time"]))
	t.Logf("refused %v after the duplicate's start (exit), %v after its first line", took.Round(time.Millisecond), last.Sub(first))

	after, err := w.reg.GetEntry(testCtx(t), "orders", "shared")
	if err != nil || after.Revision != held.Revision || after.Owner != held.Owner {
		t.Fatalf("the record after the refusal: %+v, %v; want it unwritten", after, err)
	}
	if rev, err := w.reg.LeaseRevision(testCtx(t), "orders", "shared"); err != nil || rev != lease {
		t.Fatalf("the lease after the refusal: revision %d, %v; want %d: nothing renewed it", rev, err, lease)
	}
	w.quiet(t) // the duplicate published nothing

	orig.Signal(t, syscall.SIGTERM)
	expectKind(t, w.next(t), events.Offline, "shared")
	if code := orig.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("original: exit status %d", code)
	}
	noRepeatedFields(t, orig, dup)
}

// TestRestartTakesOverAfterTheWait: announce restarted at once after a
// SIGKILL, on the same address, finds its predecessor's record. The
// address answers, but it is its own (its backend is up): it does not
// refuse, it watches the record for half the TTL (6 s, longer than one
// network operation's timeout) and takes the ID over at the end of that
// wait, in one attempt, before the old lease ends.
func TestRestartTakesOverAfterTheWait(t *testing.T) {
	t.Parallel()
	const ttl = 12 * time.Second
	if ttl/2 <= opTimeout {
		t.Fatalf("the claim's wait %v must be longer than opTimeout %v", ttl/2, opTimeout)
	}
	w := newWorldTTL(t, natstest.Start(t), ttl)
	addr := testutil.FreeAddr(t)
	id := "127.0.0.1:orders:" + strconv.Itoa(portOf(t, addr))
	start(t, backendBin, "-addr", addr).WaitFor(t, "listening on", lineTimeout)
	args := []string{"-nats", w.srv.URL(), "-service", "orders", "-addr", addr}
	crashed := announce(t, args...)
	expectKind(t, w.next(t), events.Online, id)
	crashed.Kill(t)

	restart := announce(t, args...)
	restart.WaitFor(t, "watching it for a refresh", lineTimeout)
	on := testutil.Receive(t, w.evs, ttl+exitTimeout, "the restart's online event")
	expectKind(t, on, events.Online, id)
	if in, ok := w.get(t, "orders", id); !ok || in.Incarnation != on.Incarnation {
		t.Fatalf("the record after the takeover: %+v (present %v), want the restart's", in, ok)
	}
	for _, l := range logLines(t, restart) {
		msg, _ := l["message"].(string)
		if l["level"] == "error" || strings.Contains(msg, "announce failed") || strings.Contains(fmt.Sprint(l["error"]), "deadline") {
			t.Errorf("the restart did not take the ID over in one attempt: %v", l)
		}
	}
	if !strings.Contains(restart.Stderr(), "presumed dead") {
		t.Errorf("the restart did not say it took over a holder presumed dead:\n%s", restart.Stderr())
	}

	restart.Signal(t, syscall.SIGTERM)
	expectKind(t, w.next(t), events.Offline, id)
	if code := restart.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("restart: exit status %d", code)
	}
	noRepeatedFields(t, crashed, restart)
}

// TestLogLinesRepeatNoField: no line announce writes names a field twice
// (zerolog writes a repeated key as it is given, and JSON readers keep one
// of the two values), through claims, a refusal, a restart's takeover, a
// replacement and withdrawals, with gossip and at the debug level.
func TestLogLinesRepeatNoField(t *testing.T) {
	t.Parallel()
	w := newWorldTTL(t, natstest.Start(t), 3*time.Second)
	addr1, addr2 := testutil.FreeAddr(t), testutil.FreeAddr(t)
	start(t, backendBin, "-addr", addr1).WaitFor(t, "listening on", lineTimeout)
	start(t, backendBin, "-addr", addr2).WaitFor(t, "listening on", lineTimeout)
	args := func(addr string, more ...string) []string {
		return append([]string{"-nats", w.srv.URL(), "-service", "orders", "-id", "shared", "-addr", addr,
			"-gossip-bind", "127.0.0.1:0", "-log-level", "debug"}, more...)
	}
	orig := announce(t, args(addr1)...)
	expectKind(t, w.next(t), events.Online, "shared")

	dup := announce(t, args(addr2)...) // refused: the holder's gossip node answers
	if code := dup.Wait(t, exitTimeout); code != 1 {
		t.Fatalf("duplicate: exit status %d, want 1", code)
	}
	orig.Kill(t)
	restart := announce(t, args(addr1)...) // the crashed holder's gossip node is gone: takeover after the wait
	expectKind(t, w.next(t), events.Online, "shared")
	repl := announce(t, args(addr2, "-replace")...)
	expectKind(t, w.next(t), events.Online, "shared")
	if code := restart.Wait(t, exitTimeout); code != 1 {
		t.Fatalf("replaced: exit status %d, want 1", code)
	}
	repl.Signal(t, syscall.SIGTERM)
	expectKind(t, w.next(t), events.Offline, "shared")
	if code := repl.Wait(t, exitTimeout); code != 0 {
		t.Fatalf("replacement: exit status %d", code)
	}
	for _, want := range []struct {
		p    *testutil.Proc
		what string
	}{{dup, "answers"}, {restart, "presumed dead"}, {restart, "replaced by a newer process"}} {
		if !strings.Contains(want.p.Stderr(), want.what) {
			t.Errorf("no line says %q:\n%s", want.what, want.p.Stderr())
		}
	}
	noRepeatedFields(t, orig, dup, restart, repl)
}

// logLines parses p's stderr, announce's log, one JSON object a line.
func logLines(t *testing.T, p *testutil.Proc) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range p.Lines() {
		if l.Stream != testutil.Stderr {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l.Text), &m); err != nil {
			t.Fatalf("not a JSON log line (%v): %s", err, l.Text)
		}
		out = append(out, m)
	}
	return out
}

// noRepeatedFields fails for every stderr line of ps that is not a JSON
// object or names a field twice, at any depth.
func noRepeatedFields(t *testing.T, ps ...*testutil.Proc) {
	t.Helper()
	n := 0
	for _, p := range ps {
		for _, l := range p.Lines() {
			if l.Stream != testutil.Stderr {
				continue
			}
			n++
			repeated, err := repeatedKeys(l.Text)
			if err != nil {
				t.Errorf("not a JSON log line (%v): %s", err, l.Text)
			} else if len(repeated) > 0 {
				t.Errorf("fields %q repeated: %s", repeated, l.Text)
			}
		}
	}
	if n == 0 {
		t.Error("no log line to check")
	}
}

// repeatedKeys returns the keys that an object in the JSON object line
// names twice, at any depth.
func repeatedKeys(line string) ([]string, error) {
	dec := json.NewDecoder(strings.NewReader(line))
	var repeated []string
	var value func() error
	value = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string) // the decoder checks that object keys are strings
				if seen[key] {
					repeated = append(repeated, key)
				}
				seen[key] = true
				if err := value(); err != nil {
					return err
				}
			}
		case json.Delim('['):
			for dec.More() {
				if err := value(); err != nil {
					return err
				}
			}
		default:
			return nil
		}
		_, err = dec.Token() // the closing delimiter
		return err
	}
	if !bytes.HasPrefix(bytes.TrimSpace([]byte(line)), []byte("{")) {
		return nil, errors.New("not an object")
	}
	if err := value(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one value")
	}
	return repeated, nil
}

// TestRepeatedKeys: the check itself.
func TestRepeatedKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		line string
		want []string
		err  bool
	}{
		{`{"a":1,"b":{"a":2},"c":[{"a":3,"d":4}]}`, nil, false},
		{`{"service":"x","id":"y","service":"x"}`, []string{"service"}, false},
		{`{"a":{"b":1,"b":2},"c":[{"d":1,"d":2}]}`, []string{"b", "d"}, false},
		{`not json`, nil, true},
		{`{"a":1}{"b":2}`, nil, true},
	} {
		got, err := repeatedKeys(tc.line)
		if (err != nil) != tc.err || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("repeatedKeys(%s) = %q, %v; want %q (error %v)", tc.line, got, err, tc.want, tc.err)
		}
	}
}
