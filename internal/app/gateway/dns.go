package gateway

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pushlb/pushlb/dns"
)

// startDNS starts the DNS responder over the client's lists (-dns; docs/dns.md),
// with the gateway's zone unless dns.zone names another, and its counters on
// /metrics.
func (g *Gateway) startDNS(ctx context.Context) error {
	cfg := g.cfg.DNS
	if cfg.Zone == "" {
		cfg.Zone = g.cfg.Zone
	}
	log := g.log.With().Str("component", "dns").Logger()
	cfg.Logger = &log
	s, err := dns.New(dns.ClientSource(g.client), cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.dns = s
	return g.metrics.reg.Register(dnsCollector{s})
}

// DNSAddr returns the DNS responder's address, or "" when it is off.
func (g *Gateway) DNSAddr() string {
	if g.dns == nil {
		return ""
	}
	return g.dns.Addr()
}

// dnsCollector exports the responder's counters.
type dnsCollector struct{ s *dns.Server }

var (
	dnsAnswersDesc = prometheus.NewDesc("pushlb_dns_answers_total",
		"DNS answers by result: answered (NOERROR with records), nodata, nxdomain, refused, servfail, formerr.", []string{"result"}, nil)
	dnsTruncatedDesc = prometheus.NewDesc("pushlb_dns_truncated_total",
		"UDP answers cut to fit, TC set (the asker retries over TCP).", nil, nil)
	dnsMalformedDesc = prometheus.NewDesc("pushlb_dns_malformed_total",
		"Messages dropped or refused before any answer: too short, unparsable, not a query.", nil, nil)
	dnsSourceErrorsDesc = prometheus.NewDesc("pushlb_dns_source_errors_total",
		"Queries answered SERVFAIL because no list could be read: a follow that timed out, too many follows at once.", nil, nil)
)

func (c dnsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- dnsAnswersDesc
	ch <- dnsTruncatedDesc
	ch <- dnsMalformedDesc
	ch <- dnsSourceErrorsDesc
}

func (c dnsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	for result, n := range map[string]uint64{
		"answered": st.Answered, "nodata": st.NoData, "nxdomain": st.NXDomain,
		"refused": st.Refused, "servfail": st.ServFail, "formerr": st.FormErr,
	} {
		ch <- prometheus.MustNewConstMetric(dnsAnswersDesc, prometheus.CounterValue, float64(n), result)
	}
	ch <- prometheus.MustNewConstMetric(dnsTruncatedDesc, prometheus.CounterValue, float64(st.Truncated))
	ch <- prometheus.MustNewConstMetric(dnsMalformedDesc, prometheus.CounterValue, float64(st.Malformed))
	ch <- prometheus.MustNewConstMetric(dnsSourceErrorsDesc, prometheus.CounterValue, float64(st.SourceErrors))
}
