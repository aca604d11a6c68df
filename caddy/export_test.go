package pushlbcaddy

import (
	"github.com/rs/zerolog"
	"go.uber.org/zap"
)

// RuleOf returns the rule of service's balancer in u's client, or "" when
// it has none.
func RuleOf(u *Upstreams, service string) string {
	b, err := u.client.Balancer(service)
	if err != nil {
		return ""
	}
	return b.Config().Rule
}

// Reachable counts the reachable servers of service's balancer in u's
// client (alive, breaker closed).
func Reachable(u *Upstreams, service string) int {
	b, err := u.client.Balancer(service)
	if err != nil {
		return 0
	}
	return len(b.Reachable())
}

// Active sums the active requests of service's servers in u's client:
// 0 once every pick made was reported.
func Active(u *Upstreams, service string) int64 {
	b, err := u.client.Balancer(service)
	if err != nil {
		return 0
	}
	var n int64
	for _, s := range b.Servers() {
		n += s.Stats().ActiveRequests()
	}
	return n
}

// ZerologTo returns a zerolog logger whose events go to l, as the shared
// clients' logs go to Caddy's.
func ZerologTo(l *zap.Logger) zerolog.Logger {
	return zerolog.New(zapWriter{logger: func() *zap.Logger { return l }})
}
