package main

import "context"

// hold runs hold mode: connect, wait until the address is ready, announce,
// hold the lease until SIGINT or SIGTERM, then withdraw. A stop signal
// before the announcement ends it with status 0: there is nothing to undo.
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

	sig, _ = a.interruptible(func(ctx context.Context) error { return a.announce(ctx, s) })
	if sig == nil { // announced: hold until told to stop
		for sig = range a.sigs {
			if isStop(sig) {
				a.log.Info().Stringer("signal", sig).Msg("stopping")
				break
			}
		}
	}
	if err := a.withdraw(s, "shutdown"); err != nil {
		a.log.Error().Err(err).Msg("withdraw failed; the registry entry expires with its lease")
		return exitFailure
	}
	return exitOK
}
