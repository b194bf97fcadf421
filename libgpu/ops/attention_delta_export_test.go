package ops

import (
	"fmt"

	"gpukit/libgpu/tensor"
)

// CUDAAttentionDelta runs attention's δ kernel alone (the first step of
// AttentionBackward): delta[b,h,i] = Σ_d do[b,i,h,d]·o[b,i,h,d], o and do
// [B,T,H,D] views of one dtype, delta f32 [B,H,T] contiguous. Host engines
// get ErrNoBackend.
func CUDAAttentionDelta(e *Engine, delta, o, do *tensor.Tensor) error {
	if o.Rank() != 4 || !tensor.SameShape(o.Shape, do.Shape) || delta.Numel() != o.Shape[0]*o.Shape[1]*o.Shape[2] {
		return fmt.Errorf("%w: delta %v, o %v, do %v", tensor.ErrShape, delta.Shape, o.Shape, do.Shape)
	}
	s := attnShape{b: o.Shape[0], tq: o.Shape[1], tk: o.Shape[1], h: o.Shape[2], d: o.Shape[3]}
	return e.dispatch(nil, func(c *cudaImpl) error {
		a := newAttnArgs(s, false, 1)
		a.O, a.So = devPtr(o), attnStrides(o)
		a.Dout, a.Sdo = devPtr(do), attnStrides(do)
		a.Delta = devPtr(delta)
		return c.attnBwdDelta(&a, s, o.DType, o, do)
	})
}
