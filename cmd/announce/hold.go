package main

import "context"

// hold runs hold mode: connect, wait until the address is ready, announce,
// hold the lease until SIGINT or SIGTERM, then withdraw. A stop signal
// before the announcement ends it with status 0: there is nothing to undo.
// An ID another live process holds ends it with status 1, and so does
// being replaced by a newer process (-replace).
func (a *app) hold() int {
	var s *session
	sig, err := a.interruptible(func(ctx context.Context) (err error) {
		s, err = a.connect(ctx)
		return err
	})
	if sig != nil {
		if s != nil {
			s.close()
		}
		return exitOK
	}
	if err != nil {
		a.log.Error().Err(err).Msg("cannot connect")
		return exitFailure
	}
	defer s.close()

	if sig, err = a.interruptible(a.waitReady); sig != nil {
		return exitOK
	} else if err != nil {
		a.log.Error().Err(err).Msg("instance not ready")
		return exitFailure
	}

	sig, err = a.interruptible(func(ctx context.Context) error { return a.announce(ctx, s) })
	if err != nil { // refused: another live process holds the ID
		a.log.Error().Err(err).Msg("refusing to take over the instance ID; stop the other process first, or pass -replace")
		return exitFailure
	}
	if sig == nil { // announced: hold until told to stop, or replaced
		stopHealth := a.watchHealth(s)
	hold:
		for {
			select {
			case sig = <-a.sigs:
				if isStop(sig) {
					a.log.Info().Stringer("signal", sig).Msg("stopping")
					break hold
				}
			case <-s.pub.Replaced():
				stopHealth()
				a.replaced(s)
				return exitFailure
			}
		}
		stopHealth() // so that no check marks the instance up again after the withdrawal
	}
	if err := a.withdraw(s, "shutdown"); err != nil {
		a.log.Error().Err(err).Msg("withdraw failed; the registry entry expires with its lease")
		return exitFailure
	}
	return exitOK
}

// replaced reports that a newer process took the instance ID over (started
// with -replace): this one yields and exits with status 1, touching neither
// the registry nor the events, which are the newer process's now.
func (a *app) replaced(s *session) {
	by, _ := s.pub.ReplacedBy()
	a.log.Error().Str("by_addr", by.Addr()).Int64("by_incarnation", by.Incarnation).
		Msg("replaced by a newer process for this instance ID; exiting")
	_ = a.withdraw(s, "replaced") // leaves gossip; the registry is left alone
}
