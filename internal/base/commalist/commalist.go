// Package commalist splits the comma-separated lists that flags and config
// files take (NATS URLs, gossip peers, Ribbon's listOfServers).
package commalist

import "strings"

// Split splits s at commas, trims the items and drops empty ones: "a, b,,"
// is [a b], and "" is nil.
func Split(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
