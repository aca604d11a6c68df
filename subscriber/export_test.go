package subscriber

// LeaseProbesInFlight returns the number of lease probes running, for
// tests that wait until any probe an event started has ended.
func LeaseProbesInFlight(s *Subscriber) int {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	return len(s.probes)
}

// StartWorkers is the bound on start's deliveries running at once.
func StartWorkers() int { return startWorkers }
