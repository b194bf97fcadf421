package ops

// The countabove family: how many elements of a vector exceed a threshold,
// on the device (libgpu/kernels/countabove.cu) — the flag of a While loop
// (exec.Engine.While): HRM's halting loop runs while any sequence runs.

import (
	"fmt"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// CountAbove writes to out (i32, one element) the number of elements of x
// (f32 or i32, contiguous, fewer than 2³¹) greater than thr: the flag of a
// While loop, non-zero while any sequence runs (HRM: CountAbove(flag,
// running, 0) over a 0/1 vector of the sequences not yet halted). One
// block on CUDA, meant for a batch's worth of elements. Errors wrap
// tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) CountAbove(out, x *tensor.Tensor, thr float32) error {
	if err := e.CheckScalar("count above out", out, tensor.I32); err != nil {
		return err
	}
	if x == nil {
		return fmt.Errorf("%w: count above x is missing", tensor.ErrShape)
	}
	if x.DType != tensor.F32 && x.DType != tensor.I32 {
		return fmt.Errorf("%w: count above x is %v, want f32 or i32", tensor.ErrDType, x.DType)
	}
	if err := e.CheckPlace("count above x", x); err != nil {
		return err
	}
	n := x.Numel()
	if err := checkDims(n); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		k := 0
		if x.DType == tensor.I32 {
			v, err := x.I32()
			if err != nil {
				return err
			}
			for _, a := range v {
				if float32(a) > thr {
					k++
				}
			}
		} else {
			v, err := x.F32()
			if err != nil {
				return err
			}
			for _, a := range v {
				if a > thr {
					k++
				}
			}
		}
		return out.Write(tensor.AsBytes([]int32{int32(k)}))
	}, func(c *cudaImpl) error {
		inst := "f32"
		if x.DType == tensor.I32 {
			inst = "i32"
		}
		return launch.CountAbove(c, inst, grid1(1), block1(1024), 0, devPtr(out), devPtr(x), int64(n), thr)

	})
}
