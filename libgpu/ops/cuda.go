package ops

import (
	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
)

// gridFor is the 1-D grid of a grid-stride kernel over n elements with
// blocks of bs threads, capped at 65535 blocks (the loop covers the rest).
func gridFor(n int64, bs int64) [3]uint32 {
	g := (n + bs - 1) / bs
	g = min(max(g, 1), 65535)
	return [3]uint32{uint32(g), 1, 1}
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
