package gateway

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// DefaultDataSync is how long the embedded server may keep an
// acknowledged JetStream write before it forces it to disk (fsync) when
// dataSync is not set: nats-server's own default, set explicitly so that
// a new server version cannot change it unseen. The registry is soft
// state that live instances write again within a third of the lease, so
// losing the last two minutes of it to a power loss costs one renewal's
// wait (docs/reliability.md).
const DefaultDataSync = 2 * time.Minute

// minDataSync is the shortest interval dataSync takes: the server's sync
// timer would otherwise run almost without a pause, and "always" is the
// setting for writes that must be on disk.
const minDataSync = time.Second

// dataSyncAlways is the dataSync value that forces every write to disk.
const dataSyncAlways = "always"

// dataSync is the embedded server's JetStream sync policy, as the dataSync
// key (-data-sync) says it.
type dataSync struct {
	// always forces each write to disk before the server acknowledges it.
	always bool
	// interval, otherwise, is the longest an acknowledged write waits for
	// the server's background fsync.
	interval time.Duration
}

// parseDataSync reads a dataSync value: "always", a duration of at least
// minDataSync, or "" for DefaultDataSync.
func parseDataSync(s string) (dataSync, error) {
	switch v := strings.TrimSpace(s); {
	case v == "":
		return dataSync{interval: DefaultDataSync}, nil
	case strings.EqualFold(v, dataSyncAlways):
		return dataSync{always: true, interval: DefaultDataSync}, nil
	default:
		d, err := time.ParseDuration(v)
		switch {
		case err != nil:
			return dataSync{}, fmt.Errorf("%q: want %s (fsync every write) or a duration such as 30s (fsync at most that long after a write; default %v)", s, dataSyncAlways, DefaultDataSync)
		case d < 0:
			return dataSync{}, fmt.Errorf("%v is negative", d)
		case d < minDataSync:
			return dataSync{}, fmt.Errorf("%v is below the minimum %v (%s: fsync every write)", d, minDataSync, dataSyncAlways)
		}
		return dataSync{interval: d}, nil
	}
}

// String is the policy as dataSync writes it.
func (d dataSync) String() string {
	if d.always {
		return dataSyncAlways
	}
	return d.interval.String()
}

// apply sets the policy on the embedded server's options, as nats-server's
// own configuration (jetstream { sync_interval: always | <duration> })
// would: with always, the background sync keeps the default interval.
func (d dataSync) apply(o *server.Options) {
	o.SyncAlways, o.SyncInterval = d.always, d.interval
}
