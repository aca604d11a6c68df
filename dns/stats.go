package dns

import (
	"sync/atomic"

	mdns "github.com/miekg/dns"
)

// Stats counts a responder's work since New.
type Stats struct {
	// Queries counts the queries answered (malformed ones aside).
	Queries uint64 `json:"queries"`
	// Answers counts the answers by result: NOERROR with records
	// (Answered), NOERROR without (NoData), NXDOMAIN, REFUSED, SERVFAIL,
	// FORMERR.
	Answered uint64 `json:"answered"`
	NoData   uint64 `json:"noData"`
	NXDomain uint64 `json:"nxdomain"`
	Refused  uint64 `json:"refused"`
	ServFail uint64 `json:"servfail"`
	FormErr  uint64 `json:"formerr"`
	// Truncated counts the UDP answers cut to fit, TC set.
	Truncated uint64 `json:"truncated"`
	// Malformed counts the messages dropped or refused before any answer:
	// too short, unparsable, not a query.
	Malformed uint64 `json:"malformed"`
	// SourceErrors counts the lists the Source failed to give (answered
	// SERVFAIL): a follow that timed out, too many follows at once.
	SourceErrors uint64 `json:"sourceErrors"`
	// WriteErrors counts the answers that could not be sent.
	WriteErrors uint64 `json:"writeErrors"`
}

type counters struct {
	queries, answered, noData, nxdomain, refused, servfail, formerr atomic.Uint64
	truncated, malformed, sourceErrors, writeErrors                 atomic.Uint64
}

// count counts an answer of rcode; answered says whether it holds records.
func (c *counters) count(rcode int, answered bool) {
	switch rcode {
	case mdns.RcodeSuccess:
		if answered {
			c.answered.Add(1)
		} else {
			c.noData.Add(1)
		}
	case mdns.RcodeNameError:
		c.nxdomain.Add(1)
	case mdns.RcodeRefused:
		c.refused.Add(1)
	case mdns.RcodeServerFailure:
		c.servfail.Add(1)
	case mdns.RcodeFormatError:
		c.formerr.Add(1)
	}
}

// Stats returns the responder's counters.
func (s *Server) Stats() Stats {
	c := &s.stats
	return Stats{
		Queries: c.queries.Load(), Answered: c.answered.Load(), NoData: c.noData.Load(),
		NXDomain: c.nxdomain.Load(), Refused: c.refused.Load(), ServFail: c.servfail.Load(), FormErr: c.formerr.Load(),
		Truncated: c.truncated.Load(), Malformed: c.malformed.Load(),
		SourceErrors: c.sourceErrors.Load(), WriteErrors: c.writeErrors.Load(),
	}
}
