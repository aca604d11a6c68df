package serverlist_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/pushlb/pushlb/internal/testkit/testutil"
	"github.com/pushlb/pushlb/serverlist"
)

// A weight is 1 to 1,000; 0 (absent) means the default, 100.
func TestInstanceWeightValidate(t *testing.T) {
	t.Parallel()
	for _, w := range []int{0, serverlist.MinWeight, serverlist.DefaultWeight, serverlist.MaxWeight} {
		in := inst("orders", "a", 1)
		in.Weight = w
		if err := in.Validate(); err != nil {
			t.Errorf("weight %d: %v", w, err)
		}
	}
	for _, w := range []int{-1, serverlist.MaxWeight + 1, 1 << 40} {
		in := inst("orders", "a", 1)
		in.Weight = w
		err := in.Validate()
		if !errors.Is(err, serverlist.ErrInvalidInstance) || !strings.Contains(err.Error(), "weight") {
			t.Errorf("weight %d: %v, want an ErrInvalidInstance naming the weight", w, err)
		}
	}
}

// Records written before weights existed read as weight 100; a weight of
// 0 is not written, so such records stay as they were.
func TestInstanceWeightJSON(t *testing.T) {
	t.Parallel()
	var old serverlist.Instance
	if err := json.Unmarshal([]byte(`{"service":"s","instanceId":"i","host":"h","port":1,"incarnation":2}`), &old); err != nil {
		t.Fatal(err)
	}
	if old.Weight != 0 || old.EffectiveWeight() != serverlist.DefaultWeight {
		t.Fatalf("old record: weight %d, effective %d", old.Weight, old.EffectiveWeight())
	}
	b, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "weight") {
		t.Fatalf("a default weight is written: %s", b)
	}
	w := old
	w.Weight = 300
	if b, err = json.Marshal(w); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"weight":300`) {
		t.Fatalf("JSON lacks the weight: %s", b)
	}
	var back serverlist.Instance
	if err := json.Unmarshal(b, &back); err != nil || back.Weight != 300 {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	if back.Equal(old) {
		t.Fatal("instances of weights 300 and 100 are equal")
	}
	old.Weight = serverlist.DefaultWeight
	if w.Weight = 0; !w.Equal(old) {
		t.Fatal("weight 0 and weight 100 differ")
	}
}

// A gateway's mirror skips and counts a record whose weight is out of
// range, keeping the last good value of its key.
func TestMirrorSkipsBadWeight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverlist.RegistryConfig{})
	m := startMirror(t, e.reg, serverlist.MirrorConfig{})
	good := inst("orders", "a", 1)
	good.Weight = 200
	if _, err := e.reg.Register(t.Context(), good); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the record to be mirrored", func() bool {
		in, ok := m.Get("orders", "a")
		return ok && in.Weight == 200
	})
	key, _ := serverlist.EncodeKey("orders", "a")
	bad := `{"service":"orders","instanceId":"a","host":"127.0.0.1","port":1,"incarnation":1,"weight":5000}`
	if _, err := e.reg.KeyValue().Put(t.Context(), key, []byte(bad)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the bad weight to be counted", func() bool { return m.Stats().MalformedValues == 1 })
	if in, ok := m.Get("orders", "a"); !ok || in.Weight != 200 {
		t.Fatalf("after a bad weight the mirror holds %+v, %v; want the last good record", in, ok)
	}
	if _, err := e.reg.Register(t.Context(), func() serverlist.Instance { in := good; in.Weight = 1001; return in }()); !errors.Is(err, serverlist.ErrInvalidInstance) {
		t.Fatalf("Register of weight 1001: %v", err)
	}
}
