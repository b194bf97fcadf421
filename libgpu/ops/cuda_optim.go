package ops

import (
	"fmt"
	"math"
	"unsafe"

	"gpukit/libgpu/cuda"
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

// mtAdamTensor mirrors ops_adam_tensor.
type mtAdamTensor struct {
	p, g, m, v cuda.DevicePtr
	n          int64
	wd         float32
	_          [4]byte
}

// mtAdamArgs mirrors ops_adam_args (1712 bytes, asserted in the .cu and in
// the tests).
type mtAdamArgs struct {
	t               [mtMax]mtAdamTensor
	start           [mtMax + 1]int32
	count           int32
	lr, b1, b2, eps float32
	bc              cuda.DevicePtr
	lrScale         cuda.DevicePtr
	gScale          cuda.DevicePtr
}

// mtSGDTensor mirrors ops_sgd_tensor.
type mtSGDTensor struct {
	p, g, buf cuda.DevicePtr
	n         int64
}

// mtSGDArgs mirrors ops_sgd_args (1176 bytes).
type mtSGDArgs struct {
	t          [mtMax]mtSGDTensor
	start      [mtMax + 1]int32
	count      int32
	lr, mu, wd float32
}

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

func numels(ts []*tensor.Tensor) []int {
	n := make([]int, len(ts))
	for i, t := range ts {
		n[i] = t.Numel()
	}
	return n
}

// AdamW implements Impl with two kernels on the stream: adamw_step (one
// thread) increments the i32 step counter and stores the bias corrections
// 1−β1ᵗ, 1−β2ᵗ (computed in double) for the new t; then adamw_multi updates
// every tensor, reading t's corrections from the device. Both are stream
// ordered, so every block sees the same t, and a replayed graph advances the
// counter once per replay.
func (c *cudaImpl) AdamW(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamWConfig) error {
	groups, err := mtPlan(numels(params))
	if err != nil {
		return err
	}
	if c.onSide() {
		return fmt.Errorf("%w: AdamW (its bias corrections are shared backend state)", ErrSide)
	}
	return c.dev.Do(func() error {
		sp, bc := devPtr(step), c.bc
		b1, b2 := cfg.Beta1, cfg.Beta2
		if err := c.launch(c.fn.adamStep, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1},
			unsafe.Pointer(&sp), unsafe.Pointer(&bc), unsafe.Pointer(&b1), unsafe.Pointer(&b2)); err != nil {
			return err
		}
		for _, g := range groups {
			if g.blocks() == 0 {
				continue
			}
			a := &mtAdamArgs{start: g.start, count: int32(g.hi - g.lo),
				lr: cfg.LR, b1: cfg.Beta1, b2: cfg.Beta2, eps: cfg.Eps, bc: c.bc, lrScale: devPtr(cfg.LRScale),
				gScale: devPtr(cfg.GradScale)}
			for i := g.lo; i < g.hi; i++ {
				a.t[i-g.lo] = mtAdamTensor{p: devPtr(params[i]), g: devPtr(grads[i]), m: devPtr(m[i]),
					v: devPtr(v[i]), n: int64(params[i].Numel()), wd: cfg.decay(i)}
			}
			if err := c.launch(c.fn.adamMulti, [3]uint32{g.blocks(), 1, 1}, [3]uint32{mtBlock, 1, 1},
				unsafe.Pointer(a)); err != nil {
				return err
			}
		}
		return nil
	})
}

// SGD implements Impl with sgd_multi, one launch per mtMax tensors.
func (c *cudaImpl) SGD(params, grads, mom []*tensor.Tensor, cfg SGDConfig) error {
	groups, err := mtPlan(numels(params))
	if err != nil {
		return err
	}
	return c.dev.Do(func() error {
		for _, g := range groups {
			if g.blocks() == 0 {
				continue
			}
			a := &mtSGDArgs{start: g.start, count: int32(g.hi - g.lo), lr: cfg.LR, mu: cfg.Momentum, wd: cfg.WeightDecay}
			for i := g.lo; i < g.hi; i++ {
				a.t[i-g.lo] = mtSGDTensor{p: devPtr(params[i]), g: devPtr(grads[i]), buf: devPtr(mom[i]),
					n: int64(params[i].Numel())}
			}
			if err := c.launch(c.fn.sgdMulti, [3]uint32{g.blocks(), 1, 1}, [3]uint32{mtBlock, 1, 1},
				unsafe.Pointer(a)); err != nil {
				return err
			}
		}
		return nil
	})
}
