package ops

import "gpukit/libgpu/kernels/launch"

// Kernel prefetch from the Graph methods (exec.Engine.Prefetch): an op
// family's Graph method names the kernels its steps will launch as it
// records them, so a run's kernels compile in parallel on libgpu/kernels'
// worker pool while the model is still being recorded, and only those,
// instead of one after another as the first step reaches each. It is a
// hint: a kernel not named compiles when it is first launched
// (exec.Engine.OnDemandKernels lists those, for tests).

// prefetch is Engine.Prefetch for a family's Graph method.
func (g *Graph) prefetch(file string, kernels ...string) {
	if g.shared.err == nil {
		g.e.Prefetch(file, kernels...)
	}
}

// prefetchKernels is Engine.PrefetchKernels for a family's Graph method.
func (g *Graph) prefetchKernels(ks ...launch.Kernel) {
	if g.shared.err == nil {
		g.e.PrefetchKernels(ks...)
	}
}
