// Package pushlbgrpc lets grpc-go clients use pushlb's pushed server
// lists: a resolver for the "pushlb" scheme ("pushlb:///orders") that
// hands grpc-go every change of a service's instances the moment the
// client's push path applies it, and never polls.
//
// It is a module of its own (github.com/pushlb/pushlb/grpc), so that the
// main module does not depend on grpc-go. It builds on the public
// embedding API: a started *pushlb.Client and its Watch.
//
//	c, _ := pushlb.New(nc, pushlb.Config{})
//	c.Start(ctx)
//	conn, _ := grpc.NewClient("pushlb:///orders",
//		grpc.WithResolvers(pushlbgrpc.NewBuilder(c)),
//		grpc.WithTransportCredentials(insecure.NewCredentials()),
//		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
//
// Each resolved address carries its instance's ID, zone and metadata as
// attributes (InstanceID, Zone, Metadata read them back). ResolveNow does
// nothing: the list comes on every change, unasked. A service with no
// instance makes RPCs fail at once with codes.Unavailable instead of
// waiting: with pick_first (grpc-go's default policy) the error names the
// service (ErrNoInstances: `no instances of "orders"`); round_robin says
// "no children to pick from".
//
// The resolver gives grpc-go the list; grpc-go's policy picks, or the
// pushlb balancer (RegisterBalancer, {"loadBalancingConfig":[{"pushlb":{}}]})
// picks with pushlb's rules, zones and breaker (Config). Its picker reads
// two things from each RPC: a key for keyed rules from the outgoing
// metadata (Config.HashKey), and a hint (Config.HintKey, default
// "x-pushlb-hint", or WithCallHint on the RPC's context): the servers
// announced with metadata hint=<value> take the RPC, and when none is
// alive (READY) it goes where it would have gone without the hint, as the
// gateway's X-Pushlb-Hint header. docs/grpc.md is the user's guide.
package pushlbgrpc
