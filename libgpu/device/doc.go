// Package device owns where memory lives and where work runs.
//
// A Device is either the host backend (Host: every buffer its own
// memfd_create slab mapped with mmap, so another process can map the same
// pages after receiving the fd over a Unix socket) or a GPU (CUDA: one
// device driven through libgpu/cuda in its primary context, every call on
// a pinned thread with the context current; NewCUDA, Auto, which falls
// back to the host only when there is no GPU, NoGPU). A Buffer is a byte
// range on one device; its Shareable form says how another process can map
// it (memfd, CUDA VMM fd, legacy CUipcMemHandle).
//
// Allocator is what tools allocate through: a Device in-process (Local) or
// the gpupool client (libgpu/pool), so code that allocates does not care
// which. Tools pick one from their command line with libgpu/cli/devflag.
package device
