package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/pushlb/pushlb/internal/base/ctxutil"
)

const (
	// readyInterval is the pause between two readiness checks.
	readyInterval = 100 * time.Millisecond
	// checkTimeout bounds one readiness check.
	checkTimeout = time.Second
)

// waitReady waits until the instance is ready: its address accepts TCP
// connections, or the -health URL answers 2xx. It gives up after
// -ready-timeout (unless that is 0) or when ctx ends.
func (a *app) waitReady(ctx context.Context) error {
	check, target := a.dialCheck, a.cfg.dialAddr
	if a.cfg.health != "" {
		check, target = a.healthCheck, a.cfg.health
	}
	if a.cfg.readyTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.cfg.readyTimeout)
		defer cancel()
	}
	a.log.Info().Str("check", target).Stringer("timeout", a.cfg.readyTimeout).Msg("waiting for the instance to be ready")
	start := time.Now()
	for {
		err := check(ctx)
		if err == nil {
			a.log.Debug().Stringer("after", time.Since(start)).Msg("instance ready")
			return nil
		}
		a.log.Debug().Err(err).Msg("not ready yet")
		if serr := ctxutil.Sleep(ctx, readyInterval); serr != nil {
			if errors.Is(serr, context.DeadlineExceeded) {
				return fmt.Errorf("%s not ready within %v: %w", target, a.cfg.readyTimeout, err)
			}
			return serr
		}
	}
}

// dialCheck succeeds when the address accepts a TCP connection.
func (a *app) dialCheck(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", a.cfg.dialAddr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// healthCheck succeeds when a GET of the -health URL answers 2xx.
func (a *app) healthCheck(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.cfg.health, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s: %s", a.cfg.health, resp.Status)
	}
	return nil
}
