// Package lbvisitor is the step that visits the balancers: on every change
// of a service's live set it rebuilds that service's balancer list from
// instance-ID lookups, after stopping the balancer's polling. It connects
// the subscriber to the balancers (Ribbon's seed calls the step a
// LoadBalancerVisitor), and holds the table of the services a client
// follows.
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
// A Guard (subscriber.EmptyGuard in a client) may keep the last list
// instead of one that would empty it, and Apply tells each change it makes
// as a ListChange whose causes are the ListChanged's: the cause travels
// with the list it explains.
//
// Services is the table: one balancer per followed service, built by a
// Balancers (a *balancer.Factory in a client), and its Visitor once a
// pushed list arrives (Ribbon's seed calls this the
// ServiceInstanceInfoChangedListener). A service is followed in one place
// (Follow for a configured one; Handle for the first list naming a
// registered instance) and unfollowed in one (Unfollow, which the Janitor
// calls for a service without instances or requests for a grace period).
// Services counts and logs each list change, tells the ListObserver, and
// serves Watch and WatchNames, the way adapters follow lists without
// polling. A service a pushed list builds is published (seen by requests
// and watchers) once its first list is installed.
//
// The conversion of a registry record (serverlist.Instance) into a
// balancer.Server lives here, where both packages meet, so that serverlist
// never imports the balancer. Visitors and Services own no goroutine; the
// Janitor owns one, from Start to Close.
//
// Apply calls for one Visitor are serialised; the subscriber never overlaps
// them anyway. Everything here is safe for concurrent use.
package lbvisitor
