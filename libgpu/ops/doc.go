// Package ops holds the numerical operations of gpukit: linear layers with
// fused bias and activation (and their backward), softmax cross-entropy,
// the optimizer update rules, and a few utilities. Every op has a host
// implementation (Go, GEMM through gonum's BLAS), which is the reference in
// tests, and a CUDA implementation (cuBLASLt with epilogues, NVRTC kernels).
// An Engine dispatches by device kind and validates shapes and dtypes before
// any backend runs, so backends may assume well-formed arguments.
package ops
