package ops

import (
	"fmt"
	"math"

	"gpukit/libgpu/exec"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// Multi-tensor launches (libgpu/kernels/ops_optim.cu): up to mtMax tensors
// per launch travel by value in the kernel's parameters (a __grid_constant__
// struct), so there is no table to upload and keep in sync with the
// parameter list, and a captured graph holds its own copy. Tensor i owns
// blocks [start[i], start[i+1]) of the launch, mtChunk elements per block.
// Lists longer than mtMax take several launches.
const (
	mtMax   = 32   // OPS_MT_MAX
	mtChunk = 2048 // OPS_MT_CHUNK
	mtBlock = 256
)

// mtPlan splits tensors of the given element counts into launches of at
// most mtMax tensors and returns, per launch, the index range and the block
// starts (start[count] is the grid size).
func mtPlan(sizes []int) ([]mtGroup, error) {
	var out []mtGroup
	for lo := 0; lo < len(sizes); lo += mtMax {
		hi := min(lo+mtMax, len(sizes))
		g := mtGroup{lo: lo, hi: hi}
		blocks := int64(0)
		for i := lo; i < hi; i++ {
			g.start[i-lo] = int32(blocks)
			blocks += (int64(sizes[i]) + mtChunk - 1) / mtChunk
			if blocks > math.MaxInt32 {
				return nil, fmt.Errorf("%w: optimizer launch of %d blocks", tensor.ErrShape, blocks)
			}
		}
		g.start[hi-lo] = int32(blocks)
		out = append(out, g)
	}
	return out, nil
}

type mtGroup struct {
	lo, hi int
	start  [mtMax + 1]int32
}

func (g mtGroup) blocks() uint32 { return uint32(g.start[g.hi-g.lo]) }

// mtEach calls launch for each launch of mtPlan(sizes) that has blocks, in
// order, stopping at the first error.
func mtEach(sizes []int, launch func(g mtGroup) error) error {
	groups, err := mtPlan(sizes)
	if err != nil {
		return err
	}
	for _, g := range groups {
		if g.blocks() == 0 {
			continue
		}
		if err := launch(g); err != nil {
			return err
		}
	}
	return nil
}

func numels(ts []*tensor.Tensor) []int {
	n := make([]int, len(ts))
	for i, t := range ts {
		n[i] = t.Numel()
	}
	return n
}

// adamW is Engine.AdamW with two kernels on the stream: adamw_step (one
// thread) increments the i32 step counter and stores the bias corrections
// 1−β1ᵗ, 1−β2ᵗ (computed in double) for the new t in scratch ("adamw.bc",
// the state every AdamW of the engine shares: refused on a side stream);
// then adamw_multi updates
// every tensor, reading t's corrections from the device. Both are stream
// ordered, so every block sees the same t, and a replayed graph advances the
// counter once per replay.
func (c *cudaImpl) adamW(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamWConfig) error {
	groups, err := mtPlan(numels(params))
	if err != nil {
		return err
	}
	if c.OnSide() {
		return fmt.Errorf("%w: AdamW (its bias corrections are shared backend state)", exec.ErrSide)
	}
	bc, err := c.Scratch("adamw.bc", 8)
	if err != nil {
		return err
	}
	if err := launch.AdamwStep(c, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, devPtr(step), bc, cfg.Beta1, cfg.Beta2, 0); err != nil {
		return err
	}
	for _, g := range groups {
		if g.blocks() == 0 {
			continue
		}
		a := &launch.OpsAdamArgs{Start: g.start, Count: int32(g.hi - g.lo),
			Lr: cfg.LR, B1: cfg.Beta1, B2: cfg.Beta2, Eps: cfg.Eps, Bc: bc, LrScale: devPtr(cfg.LRScale),
			GScale: devPtr(cfg.GradScale)}
		for i := g.lo; i < g.hi; i++ {
			a.T[i-g.lo] = launch.OpsAdamTensor{P: devPtr(params[i]), G: devPtr(grads[i]), M: devPtr(m[i]),
				V: devPtr(v[i]), N: int64(params[i].Numel()), Wd: cfg.decay(i)}
		}
		if err := launch.AdamwMulti(c, [3]uint32{g.blocks(), 1, 1}, [3]uint32{mtBlock, 1, 1}, 0, a); err != nil {
			return err
		}
	}
	return nil
}

// sgd is Engine.SGD with sgd_multi, one launch per mtMax tensors.
func (c *cudaImpl) sgd(params, grads, mom []*tensor.Tensor, cfg SGDConfig) error {
	return mtEach(numels(params), func(g mtGroup) error {
		a := &launch.OpsSgdArgs{Start: g.start, Count: int32(g.hi - g.lo), Lr: cfg.LR, Mu: cfg.Momentum, Wd: cfg.WeightDecay}
		for i := g.lo; i < g.hi; i++ {
			a.T[i-g.lo] = launch.OpsSgdTensor{P: devPtr(params[i]), G: devPtr(grads[i]), Buf: devPtr(mom[i]),
				N: int64(params[i].Numel())}
		}
		return launch.SgdMulti(c, [3]uint32{g.blocks(), 1, 1}, [3]uint32{mtBlock, 1, 1}, 0, a)
	})
}
