// Package picks compares, in one `go test -bench` binary, the cost of one
// pick of pushlb's balancer rules with grpc-go's round_robin picker and
// caddy's reverse-proxy selection policies, over the same list sizes.
// It holds only benchmarks: see picks_test.go and ../picks.sh.
package picks
