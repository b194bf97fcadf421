package ops

import (
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// CUDAPhilox runs dropout.cu's Philox4x32-10 on the device for one counter
// and key, writing the four output words into out (u32-sized, 4 elements:
// an i32 [4] tensor on e's device). Host engines get ErrNoBackend.
func CUDAPhilox(e *Engine, out *tensor.Tensor, ctr [4]uint32, key [2]uint32) error {
	return e.dispatch(nil, func(c *cudaImpl) error {
		return launch.Philox4x3210Kat(c, grid1(1), block1(1), 0, devPtr(out), ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1])

	})
}
