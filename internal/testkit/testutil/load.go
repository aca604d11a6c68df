package testutil

import (
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// GetLoad sends b.N GETs to url with client, from b.RunParallel's
// goroutines when parallel (set b.SetParallelism first for more clients),
// else from one, and reports requests per second ("req/s") and the p50 and
// p99 of the per-request latencies ("p50-µs", "p99-µs").
func GetLoad(b *testing.B, client *http.Client, url string, parallel bool) {
	b.Helper()
	var mu sync.Mutex
	var all []time.Duration
	gets := func(next func() bool) {
		lat := make([]time.Duration, 0, 1024)
		req, _ := http.NewRequest("GET", url, nil)
		for next() {
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			lat = append(lat, time.Since(t0))
		}
		mu.Lock()
		all = append(all, lat...)
		mu.Unlock()
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	if parallel {
		b.RunParallel(func(pb *testing.PB) { gets(pb.Next) })
	} else {
		n := 0
		gets(func() bool { n++; return n <= b.N })
	}
	elapsed := time.Since(start)
	b.StopTimer()
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(Percentile(all, 0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(Percentile(all, 0.99).Microseconds()), "p99-µs")
}
