package lbhttp

import (
	"sync"
	"time"
)

// errorLogInterval is how often the proxy logs the failures of one
// upstream: the first at once, then at most one line per interval, which
// counts the failures folded since the previous line. The metrics count
// every one.
const errorLogInterval = 10 * time.Second

// maxErrorLogKeys bounds the upstreams the limiter remembers; beyond it,
// the entries of upstreams quiet for a whole interval are forgotten.
const maxErrorLogKeys = 1024

// errorLog decides which failed requests the proxy logs, so that a dead
// instance under load costs a line per interval instead of a line per
// request (537 lines in 27 s were seen for one). Safe for concurrent use.
type errorLog struct {
	interval time.Duration
	now      func() time.Time // time.Now; tests set a clock

	mu   sync.Mutex
	last map[errorLogKey]*errorLogEntry
}

// errorLogKey is one upstream: the service and the server last tried
// (empty when none was chosen), with the answer's status.
type errorLogKey struct {
	service, server string
	status          int
}

type errorLogEntry struct {
	logged time.Time // when this key's last line was written
	folded int       // failures since, not logged
}

func newErrorLog() *errorLog {
	return &errorLog{interval: errorLogInterval, now: time.Now, last: map[errorLogKey]*errorLogEntry{}}
}

// allow reports whether a failure of k is to be logged now and, if so, how
// many failures of k were folded since its previous line.
func (l *errorLog) allow(k errorLogKey) (ok bool, folded int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.last[k]
	if e == nil {
		if len(l.last) >= maxErrorLogKeys {
			l.forgetQuiet(now)
		}
		l.last[k] = &errorLogEntry{logged: now}
		return true, 0
	}
	if now.Sub(e.logged) < l.interval {
		e.folded++
		return false, 0
	}
	folded = e.folded
	e.logged, e.folded = now, 0
	return true, folded
}

// forgetQuiet drops the keys not logged for an interval. A failure folded
// into a dropped key is still counted by the metrics; only its line's
// count is lost.
func (l *errorLog) forgetQuiet(now time.Time) {
	for k, e := range l.last {
		if now.Sub(e.logged) >= l.interval {
			delete(l.last, k)
		}
	}
}
