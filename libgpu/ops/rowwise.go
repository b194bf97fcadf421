package ops

// Shared by the row-wise families (layernorm.go, softmax.go) and the
// element-wise ones (gelu.go, add.go, dropout.go): views of tensors as
// rows, the launch geometry of libgpu/kernels/vec.cuh's row groups, and
// the alignment test that picks a kernel's vectorised instance.

import (
	"fmt"

	"gpukit/libgpu/tensor"
)

// rwRows views t ([..., C], rank ≥ 1, last dimension contiguous) as
// [rows, C] with one row stride ld: the leading dimensions must merge
// (tensor.View), as they do for contiguous tensors and for column slices
// (Narrow of the last dimension) of them.
func rwRows(what string, t *tensor.Tensor) (v *tensor.Tensor, rows, cols, ld int, err error) {
	if t.Rank() < 1 {
		return nil, 0, 0, 0, fmt.Errorf("%w: %s is a scalar, want [..., C]", tensor.ErrShape, what)
	}
	cols = t.Dim(-1)
	if t.Numel() == 0 {
		return t, 0, cols, cols, nil
	}
	rows = t.Numel() / cols
	v, err = t.View(rows, cols)
	if err != nil {
		return nil, 0, 0, 0, fmt.Errorf("%w: %s %v strides %v: leading dimensions do not merge into rows (%v)", tensor.ErrLayout, what, t.Shape, t.Strides, err)
	}
	ld = cols
	if rows > 1 {
		ld = v.Strides[0]
	}
	return v, rows, cols, ld, nil
}

// rwVecWidth is the vector width (elements) of the kernels' vectorised
// instances (vec.cuh): 8 elements moved with 16-byte accesses.
const rwVecWidth = 8

// rwVecOK reports whether a vectorised instance may run: every present
// tensor's first element 16-byte aligned and every given count (columns,
// row strides) a multiple of rwVecWidth.
func rwVecOK(ts []*tensor.Tensor, counts ...int) bool {
	for _, t := range ts {
		if t != nil && devPtr(t)%16 != 0 {
			return false
		}
	}
	for _, n := range counts {
		if n%rwVecWidth != 0 {
			return false
		}
	}
	return true
}

// rwPlan is the launch geometry of a row-wise kernel (vec.cuh's row
// groups): kernel instance suffix (e<E><s|v>: E elements cached per
// thread, scalar or vectorised), whether a whole block takes a row (else a
// warp), threads per block, and row groups per block.
type rwPlan struct {
	inst    string
	block   bool
	threads int
	groups  int
}

// rwMaxBlocks caps the blocks of a backward that writes per-block partial
// sums (layernorm's dw, db): enough to fill an H100/H200 (132 SMs) a few
// times over, few enough that the partials stay small next to the rows.
const rwMaxBlocks = 512

// rwPlanRows picks the geometry for rows of C elements: a warp per row (four
// rows per 128-thread block) caching up to 32 elements per lane when
// C ≤ 1024; else a block of up to 1024 threads per row caching 8 elements
// per thread (C ≤ 8192 read once; wider rows are read again per pass).
func rwPlanRows(C int, vec bool) rwPlan {
	v := "s"
	if vec {
		v = "v"
	}
	if C <= 32*32 {
		e := 8
		for 32*e < C {
			e *= 2
		}
		return rwPlan{inst: fmt.Sprintf("e%d%s", e, v), threads: 128, groups: 4}
	}
	t := min(1024, (C+8*32-1)/(8*32)*32)
	return rwPlan{inst: "e8" + v, block: true, threads: t, groups: 1}
}

// fwdGrid is the grid of a forward over rows: one row per group, capped
// (the kernels loop over further rows).
func (p rwPlan) fwdGrid(rows int) [3]uint32 {
	return grid1(min((rows+p.groups-1)/p.groups, 1<<20))
}

// rwElemGrid is the grid of an element-wise kernel instance inst ("s" or
// "v") of 256-thread blocks over n elements, capped at 65535 blocks (the
// kernels loop).
func rwElemGrid(n int, inst string) [3]uint32 {
	if inst == "v" {
		n = (n + rwVecWidth - 1) / rwVecWidth
	}
	return gridFor(int64(n), 256)
}

// rwElemInst is the instance suffix of an element-wise kernel over ts: "v"
// (vectors of 8) when every pointer is 16-byte aligned, else "s".
func rwElemInst(ts ...*tensor.Tensor) string {
	if rwVecOK(ts) {
		return "v"
	}
	return "s"
}

// rwFloat fails unless v's value is f32 or bf16: what the activation
// ops of these families take, checked when they are recorded.
func rwFloat(what string, v *Var) error {
	if dt := v.Value.DType; dt != tensor.F32 && dt != tensor.BF16 {
		return fmt.Errorf("%w: %s is %v, want f32 or bf16", tensor.ErrDType, what, dt)
	}
	return nil
}

// rwCheckElem checks the contiguous float tensors of an element-wise op:
// ref first (any float dtype), then others of ref's shape and, where
// sameType, its dtype.
func (e *Engine) rwCheckElem(op string, sameType bool, ref *tensor.Tensor, names []string, ts ...*tensor.Tensor) error {
	if err := e.checkView(op+" "+names[0], ref, true, floatTypes); err != nil {
		return err
	}
	dts := floatTypes
	if sameType {
		dts = []tensor.DType{ref.DType}
	}
	for i, t := range ts {
		if err := e.checkView(op+" "+names[i+1], t, true, dts, ref.Shape...); err != nil {
			return err
		}
	}
	return nil
}
