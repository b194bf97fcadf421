package ops

import "gpukit/libgpu/kernels/launch"

// Kernel prefetch. An op family's Graph method names the kernels its steps
// will launch as it records them (g.prefetch), so a run's kernels compile
// in parallel on libgpu/kernels' worker pool while the model is still
// being recorded, and only those, instead of one after another as the
// first step reaches each. It is a hint: a kernel not named compiles when
// it is first launched, as before (onDemand lists those, for tests).

// Prefetch starts compiling, in the background, the kernels of the embedded
// source file (libgpu/kernels; none named: the whole file) on the CUDA
// backend, so their first launch does not wait for NVRTC. It returns at
// once, reports nothing (a failed compilation is reported by the launch
// that needs it) and does nothing on the host.
func (e *Engine) Prefetch(file string, kernels ...string) {
	if c, ok := e.impl.(*cudaImpl); ok {
		c.prefetch(file, kernels...)
	}
}

func (c *cudaImpl) prefetch(file string, kernels ...string) {
	if kc, err := kernelCompiler(c); err == nil {
		kc.Prefetch(file, kernels...)
	}
}

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

// PrefetchKernels is Prefetch of the kernels ks (typed launcher names,
// launch.XKernel), each from its own file.
func (e *Engine) PrefetchKernels(ks ...launch.Kernel) {
	c, ok := e.impl.(*cudaImpl)
	if !ok {
		return
	}
	for _, k := range ks {
		c.prefetch(k.File, k.Name)
	}
}
