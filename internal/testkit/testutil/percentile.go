package testutil

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the nearest-rank p-quantile (0 < p <= 1) of d, which
// it does not modify, or 0 when d is empty.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	// The epsilon keeps float error (0.29*100 = 28.999999999999996 or
	// 29.000000000000004) from moving the rank.
	i := int(math.Ceil(p*float64(len(s))-1e-9)) - 1
	return s[min(max(i, 0), len(s)-1)]
}
