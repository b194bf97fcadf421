package ops

import (
	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// gridFor is the 1-D grid of a grid-stride kernel over n elements with
// blocks of bs threads, capped at 65535 blocks (the loop covers the rest).
func gridFor(n int64, bs int64) [3]uint32 {
	g := (n + bs - 1) / bs
	g = min(max(g, 1), 65535)
	return [3]uint32{uint32(g), 1, 1}
}

// vecAligned reports whether the address of t's element 0 and every
// stride in lds (elements) are multiples of vec elements of t's dtype: a
// kernel may then load and store t in vectors of vec elements.
func vecAligned(t *tensor.Tensor, vec int, lds ...int) bool {
	if uint64(t.Ptr())%uint64(vec*t.DType.Size()) != 0 {
		return false
	}
	for _, ld := range lds {
		if ld%vec != 0 {
			return false
		}
	}
	return true
}

// castBF16 queues the f32 → bf16 rounding of n elements at src into the
// scratch slot and returns the bf16 copy.
func (c *cudaImpl) castBF16(slot string, src cuda.DevicePtr, n int64) (cuda.DevicePtr, error) {
	dst, err := c.Scratch(slot, 2*n)
	if err != nil {
		return 0, err
	}
	return dst, launch.CastF32Bf16(c, gridFor(n, 256), [3]uint32{256, 1, 1}, 0, dst, src, n)
}
