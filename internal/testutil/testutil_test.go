package testutil

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestEventuallyAndSyncBuffer(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() { fmt.Fprintf(&b, "%d;", i) })
	}
	Eventually(t, "ten writes", func() bool { wg.Wait(); return len(b.String()) == 20 })
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i))
	}
	if p50, p99, p100 := Percentile(d, 0.5), Percentile(d, 0.99), Percentile(d, 1); p50 != 50 || p99 != 99 || p100 != 100 {
		t.Fatalf("p50 %v p99 %v p100 %v", p50, p99, p100)
	}
	if d[0] != 100 {
		t.Fatal("Percentile sorted its input")
	}
}
