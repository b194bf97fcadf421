package ops

import (
	"fmt"
	"math"
	"sync"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
	"gpukit/libgpu/tensor"
)

// clipMax and clipChunk mirror OPS_CLIP_MAX and OPS_CLIP_CHUNK
// (libgpu/kernels/ops_clip.cu).
const (
	clipMax   = 32
	clipChunk = 2048
	clipBlock = 256
)

// clipTensor mirrors ops_clip_tensor.
type clipTensor struct {
	g cuda.DevicePtr
	n int64
}

// clipArgs mirrors ops_clip_args (648 bytes, asserted in the .cu and in the
// tests).
type clipArgs struct {
	t     [clipMax]clipTensor
	start [clipMax + 1]int32
	count int32
}

type clipFuncs struct{ sumsq, finalize, scale, total, fromSumSq cuda.Function }

// clipFuncsByCtx caches the loaded clip kernels per CUDA context handle (a
// module is loaded once per context by kernels.ForContext; this only saves
// the per-call symbol lookups).
var (
	clipFuncsMu    sync.Mutex
	clipFuncsByCtx = map[uintptr]clipFuncs{}
)

func (c *cudaImpl) clipKernels() (clipFuncs, error) {
	clipFuncsMu.Lock()
	defer clipFuncsMu.Unlock()
	h := c.dev.Context().Handle()
	if f, ok := clipFuncsByCtx[h]; ok {
		return f, nil
	}
	kc, err := kernels.ForContext(c.dev.Context())
	if err != nil {
		return clipFuncs{}, err
	}
	var f clipFuncs
	for _, k := range []struct {
		f    *cuda.Function
		name string
	}{{&f.sumsq, "clip_sumsq_multi"}, {&f.finalize, "clip_finalize"}, {&f.scale, "clip_scale_multi"},
		{&f.total, "clip_sumsq_total"}, {&f.fromSumSq, "clip_coef_from_sumsq"}} {
		if *k.f, err = kc.Function("ops_clip.cu", k.name); err != nil {
			return clipFuncs{}, err
		}
	}
	clipFuncsByCtx[h] = f
	return f, nil
}

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
	f, err := c.clipKernels()
	if err != nil {
		return err
	}
	partial, err := c.scratchPtr("clip_partial", max(total, 1)*8)
	if err != nil {
		return err
	}
	for _, g := range groups {
		a := &clipArgs{start: g.start, count: int32(g.hi - g.lo)}
		for i := g.lo; i < g.hi; i++ {
			a.t[i-g.lo] = clipTensor{g: devPtr(grads[i]), n: int64(grads[i].Numel())}
		}
		nb := uint32(g.start[g.hi-g.lo])
		if nb == 0 {
			continue
		}
		p := partial.Add(8 * g.first)
		if err := c.launch(f.sumsq, [3]uint32{nb, 1, 1}, [3]uint32{clipBlock, 1, 1},
			unsafe.Pointer(a), unsafe.Pointer(&p)); err != nil {
			return err
		}
	}
	out, cnt := devPtr(sumsq), int32(total)
	return c.launch(f.total, [3]uint32{1, 1, 1}, [3]uint32{1024, 1, 1},
		unsafe.Pointer(&partial), unsafe.Pointer(&cnt), unsafe.Pointer(&out))
}

// clipFromSumSquares implements ClipCoefFromSumSquares: one thread of
// clip_coef_from_sumsq. Inside Do.
func (c *cudaImpl) clipFromSumSquares(sumsq *tensor.Tensor, maxNorm float32, norm, coef *tensor.Tensor) error {
	f, err := c.clipKernels()
	if err != nil {
		return err
	}
	sp, np, cp, mx := devPtr(sumsq), devPtr(norm), devPtr(coef), maxNorm
	return c.launch(f.fromSumSq, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1},
		unsafe.Pointer(&sp), unsafe.Pointer(&np), unsafe.Pointer(&cp), unsafe.Pointer(&mx))
}

// ClipGradNorm implements GradClipper with three kernels queued on the
// stream (libgpu/kernels/ops_clip.cu): per-block sums of squares in double
// into scratch, one block that reduces them in a fixed order and stores the
// norm and the coefficient on the device, and a multi-tensor scale that
// reads the coefficient. No host synchronisation; bitwise reproducible.
func (c *cudaImpl) ClipGradNorm(grads []*tensor.Tensor, maxNorm float32, norm *tensor.Tensor) error {
	return c.clip(grads, maxNorm, norm, nil, true)
}

// clip queues the sums of squares and the finalize (norm and coefficient
// into coefT, or the backend's scratch when nil) and, with scale, the
// multi-tensor scale.
func (c *cudaImpl) clip(grads []*tensor.Tensor, maxNorm float32, norm, coefT *tensor.Tensor, scale bool) error {
	groups, total, err := clipPlan(numels(grads))
	if err != nil {
		return err
	}
	return c.dev.Do(func() error {
		f, err := c.clipKernels()
		if err != nil {
			return err
		}
		partial, err := c.scratchPtr("clip_partial", max(total, 1)*8)
		if err != nil {
			return err
		}
		coef := devPtr(coefT)
		if coefT == nil {
			if coef, err = c.scratchPtr("clip_coef", 4); err != nil {
				return err
			}
		}
		args := make([]*clipArgs, len(groups))
		for gi, g := range groups {
			a := &clipArgs{start: g.start, count: int32(g.hi - g.lo)}
			for i := g.lo; i < g.hi; i++ {
				a.t[i-g.lo] = clipTensor{g: devPtr(grads[i]), n: int64(grads[i].Numel())}
			}
			args[gi] = a
			nb := uint32(g.start[g.hi-g.lo])
			if nb == 0 {
				continue
			}
			p := partial.Add(8 * g.first)
			if err := c.launch(f.sumsq, [3]uint32{nb, 1, 1}, [3]uint32{clipBlock, 1, 1},
				unsafe.Pointer(a), unsafe.Pointer(&p)); err != nil {
				return err
			}
		}
		np, cnt, mx := devPtr(norm), int32(total), maxNorm
		if err := c.launch(f.finalize, [3]uint32{1, 1, 1}, [3]uint32{1024, 1, 1},
			unsafe.Pointer(&partial), unsafe.Pointer(&cnt), unsafe.Pointer(&np), unsafe.Pointer(&coef),
			unsafe.Pointer(&mx)); err != nil {
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
			if err := c.launch(f.scale, [3]uint32{nb, 1, 1}, [3]uint32{clipBlock, 1, 1},
				unsafe.Pointer(args[gi]), unsafe.Pointer(&coef)); err != nil {
				return err
			}
		}
		return nil
	})
}

var _ GradClipper = (*cudaImpl)(nil)
