// Package testenv runs a real Kubernetes control plane for the bridge's
// tests: etcd and kube-apiserver as processes on loopback, built from their
// Go modules on first use and cached outside the checkout ([CacheDir]),
// keyed by version, so that only the first run on a machine pays the build.
//
// No kubelet, scheduler or controller-manager runs: the tests write
// EndpointSlices as the endpoint-slice controller would. kube-apiserver
// runs with --endpoint-reconciler-type=none (it would otherwise refuse a
// loopback advertise address) and the ServiceAccount admission plugin
// disabled (no controller creates the default service accounts).
//
// Under CI=true a binary that cannot be built fails the test; on a
// developer's machine the test is skipped with the build's error.
package testenv
