// Package cudaev is the CUDA half of trace.GPUTimer: timing events on one
// CUDA stream (trace.GPUEvents), through libgpu/cuda's driver bindings. It
// is a package of its own so that package trace links no CUDA binding and
// a program that only reads traces (the tracer tool) links none; a tool
// that times its GPU work imports both:
//
//	g, err := trace.NewGPUTimer(trace.Default(), cudaev.New(ctx, stream), "train")
//
// It imports nothing of package trace (the interface is satisfied by its
// method set), so trace's own GPU tests can use it.
package cudaev
