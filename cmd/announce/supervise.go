package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/pushlb/pushlb/serverlist"
)

// killGrace is how long a command that was not ready in time has to exit
// after SIGTERM before it gets SIGKILL.
const killGrace = 5 * time.Second

// child is the supervised command.
type child struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed once the command has exited
	status int           // valid once done is closed
}

// startChild starts argv with this process's stdin, stdout, stderr and
// environment, in a process group of its own.
func startChild(argv []string) (*child, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the status says it all
		c.status = exitStatus(cmd.ProcessState)
		close(c.done)
	}()
	return c, nil
}

// signal sends s to the command's process group, unless it has exited.
func (c *child) signal(s os.Signal) error {
	select {
	case <-c.done:
		return nil
	default:
		return signalProcess(c.cmd.Process, s)
	}
}

// startStatus is the exit status for a command that could not be started,
// as shells report it.
func startStatus(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return exitNotFound
	}
	return exitNoExec
}

// signalStatus is the status of a process killed by s: 128+N.
func signalStatus(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return exitFailure
}

// supervise runs supervise mode; see the package documentation for the
// sequence. It returns the command's exit status, or announce's own when
// the command never ran or was not ready in time.
func (a *app) supervise() int {
	var s *session
	sig, err := a.interruptible(func(ctx context.Context) (err error) {
		s, err = a.connect(ctx)
		return err
	})
	if sig != nil { // the command never started: report it as killed by sig
		if s != nil {
			s.close()
		}
		return signalStatus(sig)
	}
	if err != nil {
		a.log.Error().Err(err).Msg("cannot connect; the command was not started")
		return exitFailure
	}
	defer s.close()

	c, err := startChild(a.cfg.command)
	if err != nil {
		a.log.Error().Err(err).Str("command", a.cfg.command[0]).Msg("cannot start the command")
		return startStatus(err)
	}
	a.child = c
	a.log.Info().Int("pid", c.cmd.Process.Pid).Strs("command", a.cfg.command).Msg("command started")

	if code, ok := a.untilReady(c); !ok {
		return code
	}

	// Announce, while the command runs, until it exits or a stop signal.
	actx, acancel := context.WithCancel(context.Background())
	announced := make(chan error, 1)
	go func() { announced <- a.announce(actx, s) }()
	stopHealth := func() {}
	stopAnnouncing := func() {
		acancel()
		if announced != nil {
			<-announced
		}
		stopHealth()
	}
	for {
		select {
		case err := <-announced:
			announced = nil // done; it fails when cancelled, or refused
			if err == nil {
				stopHealth = a.watchHealth(s)
			}
			if err != nil && errors.Is(err, serverlist.ErrInUse) {
				a.log.Error().Err(err).Msg("refusing to take over the instance ID; stopping the command (stop the other process first, or pass -replace)")
				a.stopChild(c)
				return exitFailure
			}
		case <-s.pub.Replaced():
			stopAnnouncing()
			a.replaced(s)
			a.log.Info().Msg("stopping the command: the instance ID is the newer process's")
			a.stopChild(c)
			return exitFailure
		case <-c.done:
			stopAnnouncing()
			a.log.Info().Int("status", c.status).Msg("command exited on its own")
			if err := a.withdraw(s, "exited"); err != nil {
				a.log.Error().Err(err).Msg("withdraw failed; the registry entry expires with its lease")
			}
			return c.status
		case sig := <-a.sigs:
			if !isStop(sig) {
				a.forward(sig)
				continue
			}
			a.log.Info().Stringer("signal", sig).Msg("stopping: withdrawing before signalling the command")
			stopAnnouncing()
			return a.shutdown(s, c, sig)
		}
	}
}

// untilReady waits until the instance is ready while watching the command
// and signals. ok is false when supervise must return code instead of
// announcing: the command exited, a stop signal came, or the wait timed
// out (then the command is stopped and code is exitFailure).
func (a *app) untilReady(c *child) (code int, ok bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan error, 1)
	go func() { ready <- a.waitReady(ctx) }()
	for {
		select {
		case err := <-ready:
			if err != nil {
				a.log.Error().Err(err).Msg("instance not ready; stopping the command")
				a.stopChild(c)
				return exitFailure, false
			}
			return 0, true
		case <-c.done:
			cancel()
			<-ready
			a.log.Warn().Int("status", c.status).Msg("command exited before it was ready; nothing was announced")
			return c.status, false
		case sig := <-a.sigs:
			if !isStop(sig) {
				a.forward(sig)
				continue
			}
			cancel()
			<-ready
			a.log.Info().Stringer("signal", sig).Msg("stopping before the announcement")
			a.forward(sig)
			return a.waitChild(c), false
		}
	}
}

// shutdown withdraws the instance, drains, forwards sig to the command and
// returns its exit status.
func (a *app) shutdown(s *session, c *child, sig os.Signal) int {
	if err := a.withdraw(s, "shutdown"); err != nil {
		a.log.Error().Err(err).Msg("withdraw failed; the registry entry expires with its lease")
	}
	if a.cfg.drain > 0 {
		a.log.Info().Stringer("drain", a.cfg.drain).Msg("draining before signalling the command")
		t := time.NewTimer(a.cfg.drain)
		defer t.Stop()
	drain:
		for {
			select {
			case <-t.C:
				break drain
			case <-c.done:
				a.log.Info().Int("status", c.status).Msg("command exited during the drain")
				return c.status
			case s := <-a.sigs:
				if !isStop(s) {
					a.forward(s)
					continue
				}
				a.log.Info().Stringer("signal", s).Msg("second signal: cutting the drain short")
				sig = s
				break drain
			}
		}
	}
	a.forward(sig)
	return a.waitChild(c)
}

// waitChild waits for the command to exit, forwarding every signal, and
// returns its status.
func (a *app) waitChild(c *child) int {
	for {
		select {
		case <-c.done:
			a.log.Info().Int("status", c.status).Msg("command exited")
			return c.status
		case s := <-a.sigs:
			a.forward(s)
		}
	}
}

// stopChild stops a command that was not ready in time: SIGTERM, then
// SIGKILL after killGrace.
func (a *app) stopChild(c *child) {
	a.forward(syscall.SIGTERM)
	t := time.NewTimer(killGrace)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		a.log.Warn().Stringer("after", killGrace).Msg("command ignored SIGTERM; killing it")
		a.forward(os.Kill)
		<-c.done
	}
}
