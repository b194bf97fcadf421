package ops

// OnDemandKernels lists the kernels ("file:name") e's first launches found
// neither compiled nor prefetched (nil on the host).
func OnDemandKernels(e *Engine) []string {
	if c, ok := e.impl.(*cudaImpl); ok {
		c.kc.mu.Lock()
		defer c.kc.mu.Unlock()
		return append([]string(nil), c.kc.onDemand...)
	}
	return nil
}
