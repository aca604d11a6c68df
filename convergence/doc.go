// Package convergence answers "has this change reached every gateway?".
//
// A client applies each service's registry changes to its lists and
// knows, per service, the registry revision its list reflects and when it
// applied it (pushlb's ServiceStats.Revision, subscriber.Applied). A
// [Reporter] publishes that, opt-in and rate-bounded, on a subject of its
// own: <prefix>.report.<id>, where id names the gateway; a NATS user that
// may publish on its own report subject only gives each report an
// identity (docs/security.md). A [Viewer] subscribes to every report and
// answers, per service, which gateways are behind the newest revision any
// gateway applied, by how many revisions and for how long. Only viewers
// subscribe to the reports, never every gateway: G gateways cost G
// reports per interval, not G².
//
// The report's format is a contract (docs/protocol.md, "Convergence
// reports").
package convergence
