// Package device owns where memory lives and where work runs.
//
// A Device is either the host backend (buffers are memfd_create slabs mapped
// with mmap, so another process can map the same pages after receiving the fd
// over a Unix socket) or the CUDA backend (device memory, added by
// libgpu/device's CUDA implementation). A Buffer is a byte range on one device;
// its Shareable form says how another process can map it.
//
// Allocator is what tools allocate through: a Device in-process (Local) or the
// gpupool client (libgpu/pool), so code that allocates does not care which.
package device
