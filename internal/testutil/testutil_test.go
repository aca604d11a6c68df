package testutil

import (
	"fmt"
	"sync"
	"testing"
)

func TestEventuallyAndSyncBuffer(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() { fmt.Fprintf(&b, "%d;", i) })
	}
	Eventually(t, "ten writes", func() bool { wg.Wait(); return len(b.String()) == 20 })
}
