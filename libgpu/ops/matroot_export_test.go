package ops

// NoBatchedEigh makes e's CUDA backend decompose one matrix per syevd call
// instead of cuSOLVER's batched solver (benchmarks compare the two).
func NoBatchedEigh(e *Engine) {
	if c, ok := e.impl.(*cudaImpl); ok {
		c.noBatchedEigh = true
	}
}
