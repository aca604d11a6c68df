package serverlist

import (
	"fmt"
	"testing"
)

// TestLeaseSet: a sweep's set of lease keys answers for a record exactly
// as a set of the key strings would: the record's lease key (record +
// leaseSuffix) is held once added, another record's is not.
func TestLeaseSet(t *testing.T) {
	s := newLeaseSet()
	for i := range 1000 {
		if i%2 == 0 {
			s.add(fmt.Sprintf("rec.svc-%d.i%d%s", i/10, i, leaseSuffix))
		}
	}
	for i := range 1000 {
		record := fmt.Sprintf("rec.svc-%d.i%d", i/10, i)
		if got, want := s.holdsLeaseOf(record), i%2 == 0; got != want {
			t.Fatalf("holdsLeaseOf(%q) = %v, want %v", record, got, want)
		}
	}
	if s.holdsLeaseOf("rec.svc-0.i0" + leaseSuffix) {
		t.Fatal("a lease key read as a record holds a lease")
	}
}
