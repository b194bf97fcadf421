package ops

// The argmax family: the index of each row's largest element
// (libgpu/kernels/ops_argmax.cu; cuda_misc.go), for classification
// accuracy. Checks: opstest/check.go.

import (
	"fmt"

	"gpukit/libgpu/tensor"
)

// Argmax writes out[M] (i32) = the index of the largest element of each row
// of x[M,N] (f32), the first such index on ties. Errors as Linear.
func (e *Engine) Argmax(out, x *tensor.Tensor) error {
	m, n, err := matrix("argmax x", x)
	if err != nil {
		return err
	}
	if err := e.check("argmax x", x, tensor.F32, m, n); err != nil {
		return err
	}
	if err := e.check("argmax out", out, tensor.I32, m); err != nil {
		return err
	}
	return e.dispatch(func(h *hostImpl) error { return h.argmax(out, x) },
		func(c *cudaImpl) error { return c.argmax(out, x) })
}

func (h *hostImpl) argmax(out, x *tensor.Tensor) error {
	xs, err := x.F32()
	if err != nil {
		return fmt.Errorf("ops: host backend: %w", err)
	}
	os, err := out.I32()
	if err != nil {
		return fmt.Errorf("ops: host backend: %w", err)
	}
	m, n := x.Shape[0], x.Shape[1]
	for i := 0; i < m; i++ {
		row := xs[i*n : (i+1)*n]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		os[i] = int32(best)
	}
	return nil
}
