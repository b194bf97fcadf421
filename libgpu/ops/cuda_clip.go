package ops

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// clipMax and clipChunk mirror OPS_CLIP_MAX and OPS_CLIP_CHUNK
// (libgpu/kernels/ops_clip.cu).
const (
	clipMax   = 32
	clipChunk = 2048
	clipBlock = 256
)

// clipGroup is one multi-tensor launch: tensors [lo, hi) and their block
// starts; first is the index of its first block among all launches.
type clipGroup struct {
	lo, hi int
	first  int64
	start  [clipMax + 1]int32
}

func clipPlan(sizes []int) ([]clipGroup, int64, error) {
	var out []clipGroup
	total := int64(0)
	for lo := 0; lo < len(sizes); lo += clipMax {
		hi := min(lo+clipMax, len(sizes))
		g := clipGroup{lo: lo, hi: hi, first: total}
		blocks := int64(0)
		for i := lo; i < hi; i++ {
			g.start[i-lo] = int32(blocks)
			blocks += (int64(sizes[i]) + clipChunk - 1) / clipChunk
			if blocks > math.MaxInt32 {
				return nil, 0, fmt.Errorf("%w: clip launch of %d blocks", tensor.ErrShape, blocks)
			}
		}
		g.start[hi-lo] = int32(blocks)
		total += blocks
		out = append(out, g)
	}
	return out, total, nil
}

// sumSquares implements SumSquares: clip_sumsq_multi's per-block partial
// sums, then clip_sumsq_total (one block, fixed order) rounds their sum
// to f32 into sumsq. Inside Do.
func (c *cudaImpl) sumSquares(grads []*tensor.Tensor, sumsq *tensor.Tensor) error {
	groups, total, err := clipPlan(numels(grads))
	if err != nil {
		return err
	}
	partial, err := c.Scratch("clip_partial", max(total, 1)*8)
	if err != nil {
		return err
	}
	for _, g := range groups {
		a := &launch.OpsClipArgs{Start: g.start, Count: int32(g.hi - g.lo)}
		for i := g.lo; i < g.hi; i++ {
			a.T[i-g.lo] = launch.OpsClipTensor{G: devPtr(grads[i]), N: int64(grads[i].Numel())}
		}
		nb := uint32(g.start[g.hi-g.lo])
		if nb == 0 {
			continue
		}
		p := partial.Add(8 * g.first)
		if err := launch.ClipSumsqMulti(c, [3]uint32{nb, 1, 1}, [3]uint32{clipBlock, 1, 1}, 0, a, p); err != nil {
			return err
		}
	}
	return launch.ClipSumsqTotal(c, [3]uint32{1, 1, 1}, [3]uint32{1024, 1, 1}, 0, partial, int32(total), devPtr(sumsq))
}

// clipFromSumSquares implements ClipCoefFromSumSquares: one thread of
// clip_coef_from_sumsq. Inside Do.
func (c *cudaImpl) clipFromSumSquares(sumsq *tensor.Tensor, maxNorm float32, norm, coef *tensor.Tensor) error {
	return launch.ClipCoefFromSumsq(c, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0,
		devPtr(sumsq), devPtr(norm), devPtr(coef), maxNorm)
}

// clip is Engine.ClipGradNorm (and ClipCoef) with three kernels queued on
// the stream (libgpu/kernels/ops_clip.cu): per-block sums of squares in
// double into scratch, one block that reduces them in a fixed order and
// stores the norm and the coefficient on the device, and a multi-tensor
// scale that reads the coefficient. No host synchronisation; bitwise
// reproducible. It queues the sums of squares and the finalize (norm and coefficient
// into coefT, or the backend's scratch when nil) and, with scale, the
// multi-tensor scale.
func (c *cudaImpl) clip(grads []*tensor.Tensor, maxNorm float32, norm, coefT *tensor.Tensor, scale bool) error {
	groups, total, err := clipPlan(numels(grads))
	if err != nil {
		return err
	}
	return c.Do(func() error {
		partial, err := c.Scratch("clip_partial", max(total, 1)*8)
		if err != nil {
			return err
		}
		coef := devPtr(coefT)
		if coefT == nil {
			if coef, err = c.Scratch("clip_coef", 4); err != nil {
				return err
			}
		}
		args := make([]*launch.OpsClipArgs, len(groups))
		for gi, g := range groups {
			a := &launch.OpsClipArgs{Start: g.start, Count: int32(g.hi - g.lo)}
			for i := g.lo; i < g.hi; i++ {
				a.T[i-g.lo] = launch.OpsClipTensor{G: devPtr(grads[i]), N: int64(grads[i].Numel())}
			}
			args[gi] = a
			nb := uint32(g.start[g.hi-g.lo])
			if nb == 0 {
				continue
			}
			p := partial.Add(8 * g.first)
			if err := launch.ClipSumsqMulti(c, [3]uint32{nb, 1, 1}, [3]uint32{clipBlock, 1, 1}, 0, a, p); err != nil {
				return err
			}
		}
		if err := launch.ClipFinalize(c, [3]uint32{1, 1, 1}, [3]uint32{1024, 1, 1}, 0,
			partial, int32(total), devPtr(norm), coef, maxNorm); err != nil {
			return err
		}
		if !scale {
			return nil
		}
		for gi, g := range groups {
			nb := uint32(g.start[g.hi-g.lo])
			if nb == 0 {
				continue
			}
			if err := launch.ClipScaleMulti(c, [3]uint32{nb, 1, 1}, [3]uint32{clipBlock, 1, 1}, 0, args[gi], coef); err != nil {
				return err
			}
		}
		return nil
	})
}
