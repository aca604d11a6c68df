// Package natsaccounts writes the nats-server accounts under which pushlb's
// crash detection by client-disconnect advisories works out of the box: an
// application account with JetStream, a system account, and the import of
// the application account's disconnect advisories to the subject gateways
// follow (docs/protocol.md, "Crash detection"). The gateway's embedded
// server and the tests' servers run with it; examples/nats-server shows
// the same for a standalone server.
//
// The accounts are written as configuration text and parsed by the
// server's own parser: imports and exports set up on server.Account values
// before the server starts deliver nothing.
package natsaccounts

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/pushlb/pushlb/events"
)

// The accounts' names. Account is the one every client of the embedded
// server lands in (clients that give no credentials are its user).
const (
	Account       = "PUSHLB"
	SystemAccount = "SYS"
	// user is the application account's user that clients without
	// credentials become (no_auth_user).
	user = "pushlb"
)

// AdvisorySubject is where the server publishes the client-disconnect
// advisories of account: "$SYS.ACCOUNT.<account>.DISCONNECT", in the system
// account.
func AdvisorySubject(account string) string {
	return "$SYS.ACCOUNT." + account + ".DISCONNECT"
}

// Config returns the configuration text: the system account exports the
// application account's disconnect advisories, the application account
// (JetStream enabled) imports them to events.DisconnectAdvisorySubject(prefix),
// and a client without credentials is the application account's user. The
// user's password is random: nobody logs in with it.
func Config(prefix string) (string, error) {
	if err := events.ValidatePrefix(prefix); err != nil {
		return "", fmt.Errorf("natsaccounts: %w", err)
	}
	pw := make([]byte, 16)
	rand.Read(pw) // never fails (crypto/rand)
	return fmt.Sprintf(`accounts {
  %[1]s {
    exports: [ { stream: %[2]q } ]
  }
  %[3]s {
    jetstream: enabled
    users: [ { user: %[4]s, password: %[5]q } ]
    imports: [ { stream: { account: %[1]s, subject: %[2]q }, to: %[6]q } ]
  }
}
system_account: %[1]s
no_auth_user: %[4]s
`, SystemAccount, AdvisorySubject(Account), Account, user, hex.EncodeToString(pw), events.DisconnectAdvisorySubject(prefix)), nil
}

// Options returns server options holding Config(prefix)'s accounts, for
// the caller to complete (listen address, JetStream and its store, logs).
func Options(prefix string) (*server.Options, error) {
	text, err := Config(prefix)
	if err != nil {
		return nil, err
	}
	o := &server.Options{}
	if err := o.ProcessConfigString(text); err != nil {
		return nil, fmt.Errorf("natsaccounts: %w", err)
	}
	return o, nil
}
