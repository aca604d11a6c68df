package serverlist

import "time"

// bucketRevisions turns the bucket's revisions (its stream's sequences) into
// the mirror's, which never go back (MirrorStats.Revision), whatever
// happens to the bucket:
//
//   - a new bucket (recreated after a loss: another creation time)
//     restarts its sequences at 1: every one of them maps above the last
//     revision the mirror applied;
//   - a bucket that went back in time (its stream came back with an older
//     state than the mirror applied: a server or a cluster that lost its
//     latest acknowledged writes, which JetStream can do under power loss;
//     the same creation time, a last sequence below the highest the mirror
//     applied) keeps the sequences up to its last one, which are the
//     writes the mirror saw already (the same history), and reuses the
//     ones after it for new writes: those map above the last revision the
//     mirror applied, so that a gateway orders them after everything it
//     knew (an instance's "up" after its "down", a re-assertion after a
//     removal), where their raw sequences would look older.
//
// Only the mirror's goroutine uses it.
type bucketRevisions struct {
	created time.Time // creation time of the bucket's stream; zero before the first watch
	maxSeq  uint64    // the highest sequence of this bucket applied
	// segs are, in ascending order of from, the bases added to the
	// sequences from each from on; none: sequences are revisions.
	segs []revSegment
}

type revSegment struct{ from, base uint64 }

// of returns the mirror's revision of the bucket's sequence seq, and
// notes seq as applied.
func (r *bucketRevisions) of(seq uint64) uint64 {
	r.maxSeq = max(r.maxSeq, seq)
	for i := len(r.segs) - 1; i >= 0; i-- {
		if seq >= r.segs[i].from {
			return seq + r.segs[i].base
		}
	}
	return seq
}

// bucketChange says what changed in the bucket since the last watch.
type bucketChange uint8

const (
	sameBucket bucketChange = iota
	newBucket               // another creation time
	wentBack                // the same bucket, its last sequence below the highest applied
)

// note takes the bucket's creation time and last sequence, read before a
// watch, and applied, the last revision the mirror applied; it maps the
// sequences to come accordingly and says what it found.
func (r *bucketRevisions) note(created time.Time, lastSeq, applied uint64) bucketChange {
	switch {
	case r.created.IsZero():
		r.created = created
		return sameBucket
	case !created.Equal(r.created):
		r.created, r.maxSeq = created, 0
		r.segs = []revSegment{{from: 0, base: applied}}
		return newBucket
	case lastSeq < r.maxSeq:
		// Sequences after lastSeq are new writes: they map from applied+1
		// on. Segments that began after lastSeq described lost writes.
		keep := r.segs[:0]
		for _, s := range r.segs {
			if s.from <= lastSeq {
				keep = append(keep, s)
			}
		}
		r.segs = append(keep, revSegment{from: lastSeq + 1, base: applied - lastSeq})
		r.maxSeq = lastSeq
		return wentBack
	}
	return sameBucket
}
