package main

import (
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
)

const launchSrc = `extern "C" __global__ void gpukit_bench_add1(float* p) { p[0] += 1.0f; }`

// launch measures the cost per kernel of `kernels` one-thread launches of a
// kernel that adds 1 to one float (PyTorch's side: t.add_(1) on a 1-element
// tensor), issued eagerly or captured once into a graph and replayed.
func (b *bench) launch(w Workload) (Result, error) {
	dc, err := kernels.ForContext(b.ctx)
	if err != nil {
		return Result{}, err
	}
	res, err := dc.Compile(kernels.Source{Name: "bench_launch.cu", Code: []byte(launchSrc)}, kernels.Options{Arch: dc.Arch()})
	if err != nil {
		return Result{}, err
	}
	mod, err := cuda.ModuleLoadData(res.Image())
	if err != nil {
		return Result{}, err
	}
	defer mod.Unload()
	fn, err := mod.Function("gpukit_bench_add1")
	if err != nil {
		return Result{}, err
	}
	p, err := cuda.MemAlloc(4)
	if err != nil {
		return Result{}, err
	}
	defer cuda.MemFree(p)
	one := [3]uint32{1, 1, 1}
	issue := func() error {
		for i := 0; i < w.Kernels; i++ {
			if err := cuda.LaunchKernel(fn, one, one, 0, b.stream, unsafe.Pointer(&p)); err != nil {
				return err
			}
		}
		return nil
	}
	if w.Name == "launch_eager" {
		ms, err := b.timed(w.Iters, issue)
		return Result{MS: ms / float64(w.Kernels)}, err
	}
	if err := b.stream.BeginCapture(cuda.CaptureModeThreadLocal); err != nil {
		return Result{}, err
	}
	ierr := issue()
	g, err := b.stream.EndCapture()
	if ierr != nil {
		return Result{}, ierr
	}
	if err != nil {
		return Result{}, err
	}
	defer g.Destroy()
	exec, err := g.Instantiate()
	if err != nil {
		return Result{}, err
	}
	defer exec.Destroy()
	ms, err := b.timed(w.Iters, func() error { return exec.Launch(b.stream) })
	return Result{MS: ms / float64(w.Kernels)}, err
}
