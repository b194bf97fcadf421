package ops

import (
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// argmax is Engine.Argmax with argmax_rows (libgpu/kernels/ops_argmax.cu):
// one warp per row, first index of the maximum.
func (c *cudaImpl) argmax(out, x *tensor.Tensor) error {
	m, n := x.Shape[0], x.Shape[1]
	if err := checkDims(m, n); err != nil {
		return err
	}
	const rowsPerBlock = 8 // 256 threads
	return launch.ArgmaxRows(c, [3]uint32{uint32((m + rowsPerBlock - 1) / rowsPerBlock), 1, 1}, [3]uint32{32 * rowsPerBlock, 1, 1}, 0,
		devPtr(out), devPtr(x), int32(m), int32(n))
}
