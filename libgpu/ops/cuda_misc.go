package ops

import (
	"fmt"
	"math"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// SoftmaxCrossEntropy implements Impl with one launch of softmax_xent
// (libgpu/kernels/ops_loss.cu): one block per row computes the row's
// max-subtracted softmax, its gradient and its loss; the last block to
// finish sums the per-row losses in row order, so the loss is bitwise
// reproducible (no float atomics). A label outside [0, C) cannot be reported
// from the GPU: that row's loss is NaN, so the mean is NaN.
func (c *cudaImpl) SoftmaxCrossEntropy(loss, dlogits, logits, labels *tensor.Tensor) error {
	m, cl := logits.Shape[0], logits.Shape[1]
	if err := checkDims(m, cl); err != nil {
		return err
	}
	if c.onSide() {
		return fmt.Errorf("%w: softmax cross-entropy (its ticket counter is shared backend state)", ErrSide)
	}
	return c.dev.Do(func() error {
		rowloss, err := c.scratchPtr("rowloss", int64(m)*4)
		if err != nil {
			return err
		}
		// Threads per row: a multiple of 32 covering the classes, ≤ 256.
		bs := uint32(min(256, (cl+31)/32*32))
		return launch.SoftmaxXent(c, [3]uint32{uint32(m), 1, 1}, [3]uint32{bs, 1, 1}, 0,
			devPtr(loss), devPtr(dlogits), devPtr(logits), devPtr(labels), rowloss, c.counter, int32(m), int32(cl))
	})
}

// Argmax implements Impl with argmax_rows (libgpu/kernels/ops_argmax.cu):
// one warp per row, first index of the maximum.
func (c *cudaImpl) Argmax(out, x *tensor.Tensor) error {
	m, n := x.Shape[0], x.Shape[1]
	if err := checkDims(m, n); err != nil {
		return err
	}
	return c.dev.Do(func() error {
		const rowsPerBlock = 8 // 256 threads
		return launch.ArgmaxRows(c, [3]uint32{uint32((m + rowsPerBlock - 1) / rowsPerBlock), 1, 1}, [3]uint32{32 * rowsPerBlock, 1, 1}, 0,
			devPtr(out), devPtr(x), int32(m), int32(n))
	})
}

// Fill implements Impl with cuMemsetD32Async of the value's 32-bit pattern
// (f32 and i32 are both 4 bytes), which a captured graph records as a memset
// node.
func (c *cudaImpl) Fill(t *tensor.Tensor, v float64) error {
	var bits uint32
	switch t.DType {
	case tensor.F32:
		bits = math.Float32bits(float32(v))
	case tensor.I32:
		bits = uint32(int32(v))
	default:
		return fmt.Errorf("%w: fill of %v", tensor.ErrDType, t.DType)
	}
	return c.dev.Do(func() error {
		return cuda.MemsetD32Async(devPtr(t), bits, int64(t.Numel()), c.stream)
	})
}
