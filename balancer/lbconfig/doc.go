// Package lbconfig loads the per-client balancer configuration
// ([balancer.ClientsConfig]) from files: pushlb's YAML ([LoadYAML]), a
// Ribbon or Spring .properties file ([LoadProperties]), either chosen by
// extension ([LoadFile]), or the balancer section of a larger YAML file
// ([Section]). Package balancer keeps the data types and their logic; this
// package only reads them.
//
// YAML is decoded with yaml.v3 through internal/yamlx: defaults over
// balancer.DefaultConfig(), then each client over a copy of the decoded
// defaults, so that only the keys present change anything, nested
// settings included. Unknown keys are errors with a did-you-mean; every
// error names the line and the key path ("clients.orders.breaker.factor")
// and wraps balancer.ErrInvalidConfig, and the errors of every client are
// reported together. The format is described on balancer.ClientsConfig.
//
// The keys of a .properties file that belong to Ribbon but that pushlb
// does not use are listed in the result's IgnoredKeys, for the caller to
// log.
package lbconfig
