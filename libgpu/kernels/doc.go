// Package kernels owns gpukit's CUDA C++ kernel sources and the machinery
// that turns them into loadable images: the sources embedded with go:embed
// (every *.cu and *.cuh file of this directory), the NVRTC compile driver
// (Compiler), the content-addressed on-disk compile cache shared with the
// kernelc tool (Cache), the rewriting of NVRTC logs into file:line:col form
// (RewriteLog), and a reader for the resource report of a cubin (ParseCubin:
// registers, static shared memory, local bytes, launch bounds, arch).
//
// A kernel is compiled for the exact architecture of the device on first use
// ("sm_90a" on Hopper, see Arch) and stored in the cache under
// Key(source+headers, options, NVRTC version, arch). Later runs load the cached
// cubin after checking its header and sha256; a corrupt entry is removed and
// recompiled, never loaded.
//
// A run compiles only what it launches, in parallel: DeviceCompiler's
// Prefetcher compiles units on CompileJobs workers (GOMAXPROCS, or
// $GPUKIT_COMPILE_JOBS), libgpu/ops queues each op's kernels while a model's
// graph is recorded, and a file that marks its kernels with GPUKIT_KEEP
// (common.cuh; attention.cu, layernorm.cu) compiles one kernel per unit
// with -DGPUKIT_ONLY=<kernel>, the others left empty. A whole-file entry in
// the cache (kernelc build --libgpu) is used as it is.
//
// The .cu sources of ops live beside this file (libgpu/kernels/*.cu); they
// include "common.cuh" and nothing from the CUDA toolkit, so NVRTC needs no
// include path (see common.cuh).
package kernels
