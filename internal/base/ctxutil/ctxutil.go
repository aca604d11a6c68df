// Package ctxutil holds context helpers shared by the project's packages.
package ctxutil

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx ends, and returns ctx's error in the
// latter case.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
