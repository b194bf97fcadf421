package ops

import "gpukit/libgpu/tensor"

// CUDAPhilox runs dropout.cu's Philox4x32-10 on the device for one counter
// and key, writing the four output words into out (u32-sized, 4 elements:
// an i32 [4] tensor on e's device). Host engines get ErrNoBackend.
func CUDAPhilox(e *Engine, out *tensor.Tensor, ctr [4]uint32, key [2]uint32) error {
	return e.dispatch(nil, func(c *cudaImpl) error {
		return c.launchK("dropout.cu", "philox4x32_10_kat", grid1(1), block1(1), 0, kPtr(out),
			dropU32(ctr[0]), dropU32(ctr[1]), dropU32(ctr[2]), dropU32(ctr[3]), dropU32(key[0]), dropU32(key[1]))
	})
}
