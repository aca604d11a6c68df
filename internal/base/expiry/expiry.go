// Package expiry holds a bounded set of keys that each expire at a time
// of their own: a negative cache ("this was not there a moment ago").
package expiry

import "time"

// Set is a set of keys with an expiry each, holding at most Max keys:
// when full, Add drops the expired keys, and if none has expired, all of
// them (a flood of new keys then costs a fresh start, never unbounded
// memory). The zero Set is not usable: build it with New.
//
// Threading: not safe for concurrent use; its owner locks.
type Set struct {
	m   map[string]time.Time
	max int
}

// New returns an empty set of at most max keys.
func New(max int) *Set { return &Set{m: make(map[string]time.Time), max: max} }

// Add puts key in the set until until; now is the current time.
func (s *Set) Add(key string, until, now time.Time) {
	if len(s.m) >= s.max {
		for k, exp := range s.m {
			if now.After(exp) {
				delete(s.m, k)
			}
		}
		if len(s.m) >= s.max {
			clear(s.m)
		}
	}
	s.m[key] = until
}

// Has reports whether key is in the set and not expired at now; an
// expired key is dropped.
func (s *Set) Has(key string, now time.Time) bool {
	exp, ok := s.m[key]
	if !ok {
		return false
	}
	if now.After(exp) {
		delete(s.m, key)
		return false
	}
	return true
}

// Len returns the number of keys held, expired ones included.
func (s *Set) Len() int { return len(s.m) }
