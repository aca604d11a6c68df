package pushlbgrpc

import (
	"context"
	"sync"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	lb "github.com/pushlb/pushlb/balancer"
)

// WithCallZone returns a context that makes the pushlb balancer prefer
// zone for the RPCs made with it, while that zone has a READY server whose
// breaker is closed; otherwise the balancer's normal choice applies. It is
// the balancer core's WithZone: a request context that already carries a
// zone (from pushlb's HTTP hints) keeps it across the call.
func WithCallZone(ctx context.Context, zone string) context.Context {
	return lb.WithZone(ctx, zone)
}

// WithCallHint returns a context whose RPCs prefer the servers announced
// with metadata hint=<hint>, falling back to the usual choice when none
// is alive (READY, or connecting for the first time): the balancer core's
// WithHint, as an RPC's metadata under the hint key (Config.HintKey,
// DefaultHintKey) does. The metadata's hint wins over the context's.
func WithCallHint(ctx context.Context, hint string) context.Context {
	return lb.WithHint(ctx, hint)
}

// picker picks with the core balancer among the READY endpoints, then
// hands the RPC to that endpoint's pickfirst child.
//
// The balancer publishes a new one on every list or connectivity change.
// A core server carries its endpoint (lb.Server.Value); a connectivity change
// updates an endpoint's child picker in place (atomically) and the core's
// liveness. An RPC that lands on a server whose connection is not READY
// (its first connection under way, or a core list newer than the picker)
// waits for the next picker (ErrNoSubConnAvailable).
type picker struct {
	core    *lb.Balancer
	hashKey string
	hintKey string // "" for none (Config.hintKey), or while no endpoint carries a hint
	// untimed: the core does not time its picks (lb.WithoutPickTiming),
	// so a pick's outcome needs only its server, which the endpoint
	// knows: the pick hands grpc-go the endpoint's own Done.
	untimed bool
}

// Pick implements balancer.Picker. Without a hash key, and for an RPC
// whose metadata carries no hint, it allocates nothing: the outcome is
// reported through the endpoint's own Done when the core does not time its
// picks, else through a pooled record. A hint (the metadata's, else one
// set with lb.WithHint on the RPC's context, which the core reads) costs
// the metadata's copy and a context.
func (p *picker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	ctx := info.Ctx
	if p.hashKey != "" {
		if v := metadata.ValueFromOutgoingContext(ctx, p.hashKey); len(v) > 0 {
			ctx = lb.WithKey(ctx, v[0])
		}
	}
	if p.hintKey != "" {
		if v := metadata.ValueFromOutgoingContext(ctx, p.hintKey); len(v) > 0 && v[0] != "" {
			ctx = lb.WithHint(ctx, v[0])
		}
	}
	pk, err := p.core.Pick(ctx)
	if err != nil {
		return balancer.PickResult{}, status.Errorf(codes.Unavailable, "pushlb: %s: %v", p.core.Name(), err)
	}
	e, _ := pk.Server.Value.(*endpoint)
	var child *childPicker
	if e != nil {
		child = e.child.Load()
	}
	if child == nil {
		pk.End()
		return balancer.PickResult{}, balancer.ErrNoSubConnAvailable
	}
	res, err := child.Pick(info)
	if err != nil {
		pk.End()
		return res, err
	}
	if p.untimed && res.Done == nil {
		if e.core.Load() != pk.Server {
			e.core.Store(pk.Server) // once per copy, not per pick
		}
		res.Done = e.report
		return res, nil
	}
	d := donePool.Get().(*doneRecord)
	d.pick, d.next = pk, res.Done
	res.Done = d.report
	return res, nil
}

// doneRecord carries one RPC's pick to its Done. Records are pooled so
// that a pick allocates nothing; report is bound once, when the record is
// made. grpc-go calls Done at most once per attempt (csAttempt.finish),
// which makes the recycling safe.
type doneRecord struct {
	pick   lb.Pick
	next   func(balancer.DoneInfo) // the child's Done, if any
	report func(balancer.DoneInfo) // d.done, bound once
}

var donePool sync.Pool

func init() {
	// Set here: a New in the declaration would refer to done, which
	// refers to donePool.
	donePool.New = func() any {
		d := new(doneRecord)
		d.report = d.done
		return d
	}
}

func (d *doneRecord) done(info balancer.DoneInfo) {
	pk, next := d.pick, d.next
	d.pick, d.next = lb.Pick{}, nil
	donePool.Put(d)
	pk.Done(outcome(info))
	if next != nil {
		next(info)
	}
}

// outcome turns grpc-go's report of an RPC into the core's: the server
// answered when it sent anything (an application error status included:
// it is reachable, and its answer time counts), with a server error for
// outlier detection when the status says the server failed (Internal,
// Unknown, DataLoss, Unavailable: what Envoy maps to 5xx); an Unavailable
// with nothing received is a connection failure, which counts towards the
// server's breaker; any other failure (deadline, cancellation) only ends
// the request.
func outcome(info balancer.DoneInfo) lb.DoneInfo {
	switch {
	case info.Err == nil:
		return lb.DoneInfo{}
	case info.BytesReceived:
		switch status.Code(info.Err) {
		case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unavailable:
			return lb.DoneInfo{ServerError: true}
		}
		return lb.DoneInfo{}
	case status.Code(info.Err) == codes.Unavailable:
		return lb.DoneInfo{Err: info.Err, ConnectFailure: true}
	default:
		return lb.DoneInfo{Err: info.Err}
	}
}
