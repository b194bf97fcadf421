package ops

import "gpukit/libgpu/exec"

// NoBatchedEigh makes e's CUDA backend decompose one matrix per syevd call
// instead of cuSOLVER's batched solver (benchmarks compare the two).
func NoBatchedEigh(e *Engine) {
	if e.c != nil {
		exec.StateOf[eighState](e.c.CUDA).noBatched = true
	}
}
