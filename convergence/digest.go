package convergence

import "strconv"

// ListDigest sums a server list for Applied.Digest (docs/protocol.md §8):
// FNV-1a, 64 bits, over each instance in ID order: the ID's length as 8
// bytes big-endian, the ID, the incarnation as 8 bytes big-endian. Two
// lists with the same digest hold the same instances. The zero value is
// not ready: start from NewListDigest. It allocates nothing until Sum.
type ListDigest struct{ h uint64 }

// FNV-1a's 64-bit parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// NewListDigest returns the digest of an empty list so far.
func NewListDigest() ListDigest { return ListDigest{h: fnvOffset} }

// Add adds the next instance of the list, in ID order.
func (d *ListDigest) Add(id string, incarnation int64) {
	d.word(uint64(len(id)))
	for i := 0; i < len(id); i++ {
		d.h = (d.h ^ uint64(id[i])) * fnvPrime
	}
	d.word(uint64(incarnation))
}

// word adds v as 8 bytes, big-endian.
func (d *ListDigest) word(v uint64) {
	for shift := 56; shift >= 0; shift -= 8 {
		d.h = (d.h ^ (v >> shift & 0xff)) * fnvPrime
	}
}

// Sum returns the digest as 16 hex digits.
func (d ListDigest) Sum() string {
	s := strconv.FormatUint(d.h, 16)
	for len(s) < 16 {
		s = "0" + s
	}
	return s
}
