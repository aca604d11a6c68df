package serverlist

import (
	"testing"
	"time"
)

// TestBucketRevisions: the mirror's revisions never go back. A new
// bucket's sequences map above the last applied; a bucket that went back
// keeps the sequences it still holds (the history the mirror saw) and maps
// the reused ones above the last applied; twice over, the segments of
// lost writes are dropped.
func TestBucketRevisions(t *testing.T) {
	t0 := time.Unix(1, 0)
	var r bucketRevisions
	if c := r.note(t0, 0, 0); c != sameBucket {
		t.Fatalf("first note: %v", c)
	}
	for seq := uint64(1); seq <= 10; seq++ {
		if got := r.of(seq); got != seq {
			t.Fatalf("of(%d) = %d before any change", seq, got)
		}
	}
	if c := r.note(t0, 12, 10); c != sameBucket {
		t.Fatalf("a bucket ahead of the mirror: %v, want the same bucket", c)
	}
	// Back to 6: 1-6 are the writes seen, 7 on are new, above 10.
	if c := r.note(t0, 6, 10); c != wentBack {
		t.Fatalf("a bucket back at 6 of 10: %v, want went back", c)
	}
	for seq, want := range map[uint64]uint64{3: 3, 6: 6, 7: 11, 9: 13} {
		if got := r.of(seq); got != want {
			t.Fatalf("after going back to 6: of(%d) = %d, want %d", seq, got, want)
		}
	}
	// Applied up to 13 (sequence 9); back again, to 8: 7 and 8 kept (11,
	// 12), 9 on new, above 13.
	if c := r.note(t0, 8, 13); c != wentBack {
		t.Fatalf("back again: %v", c)
	}
	for seq, want := range map[uint64]uint64{5: 5, 7: 11, 8: 12, 9: 14} {
		if got := r.of(seq); got != want {
			t.Fatalf("after going back to 8: of(%d) = %d, want %d", seq, got, want)
		}
	}
	// Back before the first change: its segment goes.
	if c := r.note(t0, 4, 14); c != wentBack || len(r.segs) != 1 {
		t.Fatalf("back to 4: %v with segments %v, want one", c, r.segs)
	}
	if got := r.of(5); got != 15 {
		t.Fatalf("after going back to 4: of(5) = %d, want 15", got)
	}
	// A new bucket: every sequence above the last applied.
	if c := r.note(t0.Add(time.Hour), 2, 15); c != newBucket {
		t.Fatalf("a new bucket: %v", c)
	}
	if got := r.of(1); got != 16 {
		t.Fatalf("a new bucket's first write: %d, want 16", got)
	}
}
