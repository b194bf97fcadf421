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
// The .cu sources of ops live beside this file (libgpu/kernels/*.cu); they
// include "common.cuh" and nothing from the CUDA toolkit, so NVRTC needs no
// include path (see common.cuh).
package kernels
