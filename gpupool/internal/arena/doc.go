// Package arena owns the sub-allocator that places allocations inside one
// slab: best fit over a free list kept sorted by offset, neighbouring free
// ranges coalesced on free, every offset and length a multiple of the
// arena's alignment (256 bytes in gpupool, the alignment cudaMalloc
// guarantees: CUDA C++ Programming Guide, "Device Memory Accesses").
package arena
