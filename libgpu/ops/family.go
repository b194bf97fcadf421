package ops

// The op-family pattern. An op family (layernorm, attention, embedding,
// ...) lives in one place and is added without editing any central table:
//
//   - libgpu/ops/<family>.go: the Engine methods (forward and backward,
//     argument checks), the host implementation, the CUDA launch code, and
//     the Graph method that records
//     the op on an autograd tape (forward and backward in one closure pair);
//   - libgpu/kernels/<family>.cu: the kernels, extern "C", one instance per
//     dtype named <kernel>_f32 / <kernel>_bf16 (dtName), their typed
//     launchers generated into libgpu/kernels/launch (go generate);
//   - libgpu/ops/opstest/<family>.go: the float64 reference and the checks
//     (forward against the reference with outputs poisoned first, backward
//     against finite differences, accumulation, validation), registered
//     with opstest.Register so opstest.CheckFamilies runs them on every
//     backend and precision.
//
// Engine methods dispatch with e.dispatch(host, cuda) (engine.go); CUDA
// code launches each kernel through its typed launcher
// (libgpu/kernels/launch, generated from the .cu: launch.SiluFwd(c,
// inst, grid, block, smem, y, x, n)), with the backend c as the
// launch.Launcher; the runtime (libgpu/exec) compiles the kernel from the
// embedded source through the kernel cache on first use. The Graph method
// names the kernels (or the file) its steps launch with g.prefetch
// (prefetch.go), so they compile in parallel while the model is recorded.
// State a family keeps per engine lives in exec.StateOf.

import (
	"fmt"
	"math"

	"gpukit/libgpu/exec"
	"gpukit/libgpu/tensor"
)

// dtSuffix is the kernel-name suffix of a floating dtype's instance.
func dtSuffix(dt tensor.DType) string {
	switch dt {
	case tensor.BF16:
		return "_bf16"
	case tensor.F16:
		return "_f16"
	}
	return "_f32"
}

// dtName is a floating dtype's name in kernel instance names ("f32",
// "bf16", "f16").
func dtName(dt tensor.DType) string { return dtSuffix(dt)[1:] }

// grid1 is the 1-D grid of n blocks (at least 1, at most 2³¹−1).
func grid1(n int) [3]uint32 { return [3]uint32{uint32(min(max(n, 1), math.MaxInt32)), 1, 1} }

// block1 is a 1-D block of n threads.
func block1(n int) [3]uint32 { return [3]uint32{uint32(n), 1, 1} }

// hostIn returns the elements of an f32, bf16 or f16 host tensor of any
// strides as row-major f32: the tensor's own memory when it is contiguous
// f32 (do not write to it), else a widened copy.
func hostIn(t *tensor.Tensor) ([]float32, error) {
	if t == nil {
		return nil, nil
	}
	if t.DType == tensor.F32 && t.Contiguous() {
		s, err := t.F32()
		if err != nil {
			return nil, fmt.Errorf("ops: host backend: %w", err)
		}
		return s, nil
	}
	s, err := t.ReadFloat32()
	if err != nil {
		return nil, fmt.Errorf("ops: host backend: %w", err)
	}
	return s, nil
}

// hostIns is hostIn of each tensor, in order (a nil tensor gives nil).
func hostIns(ts ...*tensor.Tensor) ([][]float32, error) {
	ins := make([][]float32, len(ts))
	for i, t := range ts {
		var err error
		if ins[i], err = hostIn(t); err != nil {
			return nil, err
		}
	}
	return ins, nil
}

// hostOut64 writes v (float64 sums, rounded to f32) to t, or adds them to
// its contents with acc (hostOut's rules).
func hostOut64(t *tensor.Tensor, acc bool, v []float64) error {
	out, commit, err := hostOut(t, acc)
	if err != nil {
		return err
	}
	for j := range out {
		out[j] = float32(v[j])
	}
	return commit()
}

// hostMap is the host side of an element-wise op: y = f(x) per element.
func hostMap(y, x *tensor.Tensor, f func(x float32) float32) error {
	xs, err := hostIn(x)
	if err != nil {
		return err
	}
	ys, commit, err := hostOut(y, false)
	if err != nil {
		return err
	}
	for i, v := range xs {
		ys[i] = f(v)
	}
	return commit()
}

// hostMapBackward is the host side of an element-wise op's backward: dx =
// f(dy, x) per element, or added to dx when acc. dx may be dy: each
// element is read before it is written.
func hostMapBackward(dx, dy, x *tensor.Tensor, acc bool, f func(dy, x float32) float32) error {
	xs, err := hostIn(x)
	if err != nil {
		return err
	}
	gs, err := hostIn(dy)
	if err != nil {
		return err
	}
	dxs, commit, err := hostOut(dx, acc)
	if err != nil {
		return err
	}
	for i, v := range xs {
		dxs[i] = f(gs[i], v)
	}
	return commit()
}

// hostOut returns row-major f32 space for an op's result for t (f32,
// bf16 or f16, any strides, host memory) and the commit that stores it:
// rounding to t's dtype, and adding to t's values when acc. For a
// contiguous f32 t written without acc the space is t's memory and commit
// does nothing.
func hostOut(t *tensor.Tensor, acc bool) ([]float32, func() error, error) {
	if t == nil {
		return nil, func() error { return nil }, nil
	}
	if t.DType == tensor.F32 && t.Contiguous() && !acc {
		s, err := t.F32()
		if err != nil {
			return nil, nil, fmt.Errorf("ops: host backend: %w", err)
		}
		return s, func() error { return nil }, nil
	}
	buf := make([]float32, t.Numel())
	return buf, func() error {
		if acc {
			old, err := t.ReadFloat32()
			if err != nil {
				return err
			}
			for i := range buf {
				buf[i] += old[i]
			}
		}
		return t.WriteFloat32(buf)
	}, nil
}

// floatTypes are the dtypes floating-point ops take.
var floatTypes = []tensor.DType{tensor.F32, tensor.BF16}

// checkView verifies that t is present, of one of the dtypes dts, of shape
// want (a nil want accepts any shape), inside its buffer and on the
// engine's device; with contig, that it is contiguous, else that its last
// dimension is (row-strided views).
func (e *Engine) checkView(what string, t *tensor.Tensor, contig bool, dts []tensor.DType, want ...int) error {
	if t == nil {
		return fmt.Errorf("%w: %s is missing", tensor.ErrShape, what)
	}
	okType := false
	for _, d := range dts {
		okType = okType || t.DType == d
	}
	if !okType {
		return fmt.Errorf("%w: %s is %v, want one of %v", tensor.ErrDType, what, t.DType, dts)
	}
	if want != nil && !tensor.SameShape(t.Shape, want) {
		return fmt.Errorf("%w: %s is %v, want %v", tensor.ErrShape, what, t.Shape, want)
	}
	if t.Buf == nil {
		return fmt.Errorf("%w: %s has no buffer", tensor.ErrShape, what)
	}
	for _, s := range t.Strides {
		if s < 0 {
			return fmt.Errorf("%w: %s has a negative stride %v", tensor.ErrLayout, what, t.Strides)
		}
	}
	if contig && !t.Contiguous() {
		return fmt.Errorf("%w: %s %v strides %v (want contiguous)", tensor.ErrLayout, what, t.Shape, t.Strides)
	}
	if !t.InnerContiguous() {
		return fmt.Errorf("%w: %s %v strides %v (want the last dimension contiguous)", tensor.ErrLayout, what, t.Shape, t.Strides)
	}
	if !exec.SameDevice(t.Device(), e.Device()) {
		return fmt.Errorf("%w: %s is on %v, engine on %v", exec.ErrDevice, what, t.Device(), e.Device())
	}
	if int64(t.Offset+t.Extent())*int64(t.DType.Size()) > t.Buf.Size() {
		return fmt.Errorf("%w: %s view runs past its buffer", tensor.ErrShape, what)
	}
	return nil
}

// sameShapes fails unless every tensor has ref's shape.
func sameShapes(op string, ref *tensor.Tensor, ts ...*tensor.Tensor) error {
	for _, t := range ts {
		if t != nil && !tensor.SameShape(t.Shape, ref.Shape) {
			return fmt.Errorf("%w: %s: %v and %v", tensor.ErrShape, op, ref.Shape, t.Shape)
		}
	}
	return nil
}

// rowsCols views a tensor of rank ≥ 1 as rows × cols, cols the last
// dimension (a scalar is 1 × 1).
func rowsCols(t *tensor.Tensor) (rows, cols int) {
	if len(t.Shape) == 0 {
		return 1, 1
	}
	cols = t.Shape[len(t.Shape)-1]
	if cols == 0 {
		return 0, 0
	}
	return t.Numel() / cols, cols
}
