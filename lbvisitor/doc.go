// Package lbvisitor is the step that visits the balancers: on every change
// of a service's live set it rebuilds that service's balancer list from
// instance-ID lookups, after stopping the balancer's polling. It connects
// the subscriber to the balancers (Ribbon's seed calls the step a
// LoadBalancerVisitor).
//
// A Visitor wraps one balancer. Creating it stops the balancer's polling
// updater. Apply takes a ListChanged (the full list of live IDs), resolves
// every ID through serverlist's Lookup (a map read in the local mirror; a
// direct registry read with bounded backoff on a miss) and sets the
// balancer's servers. An ID the registry does not hold is left out: the
// event is a hint, the registry is the truth. An ID whose lookup fails for
// another reason (the registry is unreachable) keeps its last known server,
// so a registry outage never empties a list; Apply then returns an error so
// the subscriber retries. Stats of servers that stay survive the rebuild.
//
// A Registry holds one Visitor per service and creates it, with its
// balancer, through a balancer.Balancers (a *balancer.Factory in a gateway),
// on the first ListChanged for that service (Ribbon's seed calls this the
// ServiceInstanceInfoChangedListener).
//
// The conversion of a registry record (serverlist.Instance) into a
// balancer.Server lives here, where both packages meet, so that serverlist
// never imports the balancer. Visitors and the Registry own no goroutine:
// there is nothing to start or close; the balancers belong to whoever made
// them.
//
// Apply calls for one Visitor are serialised; the subscriber never overlaps
// them anyway. Everything here is safe for concurrent use.
package lbvisitor
