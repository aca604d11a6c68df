package balancer

// Internals the external tests (package balancer_test) wait on.

// FactoryWaiting returns how many Get and Close calls of f are blocked on
// a build in progress.
func FactoryWaiting(f *Factory) int64 { return f.waiting.Load() }
