package pushlb

import (
	"github.com/pushlb/pushlb/balancer"
	"github.com/pushlb/pushlb/lbvisitor"
)

// ListChange is one change of a service's server list, as a ListObserver
// hears it: who joined, who left, and why each did (see
// lbvisitor.ListChange, where the push path builds it).
type ListChange = lbvisitor.ListChange

// ServerChange is one server that joined or left a list, with its cause.
type ServerChange = lbvisitor.ServerChange

// ListObserver is told of every change of every service's server list
// (WithListObserver). Changes of one service arrive one at a time and in
// order; those of different services may arrive concurrently. It runs on
// the goroutine that applies the change, so it must be quick and must not
// block: hand the work to another goroutine. The slices are its own; the
// servers are the balancer's.
type ListObserver = lbvisitor.ListObserver

// Watch calls f with the current server list of service at once, and again
// after each change of that list, until stop is called: the way an adapter
// (a gRPC resolver, a proxy's upstream source) follows one service's pushed
// list without polling. The list is empty while the client has no balancer
// for the service (nothing announced it yet) and when its last instance
// left.
//
// Each call reads the list as it is when the call runs, so a call is never
// older than the one before it; the same list may come twice. Calls for
// one watch never overlap. f runs on the goroutine that applied the change
// (or on Watch's caller for the first call), so it must be quick and must
// not block; it may call stop. stop does not wait for a call in progress
// (so that f may call it): a call already past its start may still run,
// none begins after. The slice is f's own; the servers are the balancer's
// (read them, do not modify them). Watch works before Start and after
// Close (the lists then stay as they are).
func (c *Client) Watch(service string, f func(servers []*balancer.Server)) (stop func()) {
	return c.services.Watch(service, f)
}

// WatchServices calls f with the names of the services the client has a
// balancer for, sorted as Services returns them, at once and again after
// each time one is added (its first list, or a configured service at
// Start) or removed (gone for Config.ServiceGrace), until stop is called:
// the way an adapter that serves every service (the xds module's control
// plane) learns of a new one without polling. Follow each service's list
// with Watch.
//
// The call rules are Watch's: each call reads the names as they are when
// it runs, so it is never older than the one before it, and the same
// names may come twice; calls never overlap; f runs on the goroutine that
// added or removed the service (or on WatchServices' caller for the first
// call), so it must be quick and must not block, and it may call stop,
// after which no call begins. The slice is f's own.
func (c *Client) WatchServices(f func(services []string)) (stop func()) {
	return c.services.WatchNames(f)
}
