package zero

import (
	"errors"
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// AdamW is torch.optim.AdamW (ops.AdamWConfig) with its state split
// across ranks, ZeRO-1's flat path (see the package doc): this rank keeps
// exp_avg and exp_avg_sq for its part of every bucket and updates only
// those elements, then all-gathers the parameters' buckets. Its results
// are those of optim.AdamW over the averaged gradients, up to the order
// in which the global gradient norm is summed.
type AdamW struct {
	c      Collective
	l      *dist.Layout
	rank   int
	params *dist.Grads // the parameters in bucket storage
	segs   []dist.Segment
	// Per segment: 1-D views of the parameter, its gradient and its
	// moments.
	p, g, m, v []*tensor.Tensor
	base       []int // per bucket: where its part starts in the moments
	mBuf, vBuf *tensor.Tensor
	step       *tensor.Tensor
	sumsq      *tensor.Tensor
	cfg        ops.AdamWConfig // NoDecay per segment
	noDecay    []bool          // per parameter of the layout
	bufs       []*tensor.Tensor
}

// NewAdamW makes rank c.Rank()'s AdamW over the parameters and gradients
// laid out by l (l.Shards must be c.Size(); every bucket f32): params and
// grads are the bucket storage of the parameters (the model's values,
// nn.GPT.SetParams) and of their gradients (nn.GPT.SetGrads, reduce-
// scattered by an nccl.Reducer in Scatter mode). cfg is AdamW's
// configuration with NoDecay, when set, one entry per parameter of l.
// State, allocated through a under prefix and zero: "exp_avg.shard" and
// "exp_avg_sq.shard" (f32, this rank's parts of the buckets back to back:
// Σ_b Numel_b/n elements each), "step" ([1] i32, the same on every rank,
// incremented by every Step); work: "work/sumsq" ([1] f32). Errors
// (ErrConfig): a layout of another number of parts, buckets of another
// dtype, storage of another layout, a rank whose parts hold no parameter
// (more ranks than the model can use); allocation errors. Nothing stays
// allocated on error.
func NewAdamW(a device.Allocator, prefix string, c Collective, l *dist.Layout, params, grads *dist.Grads, cfg ops.AdamWConfig) (o *AdamW, err error) {
	if l.Shards != c.Size() {
		return nil, fmt.Errorf("%w: buckets cut into %d parts for %d ranks (dist.BucketConfig.Shards)", ErrConfig, l.Shards, c.Size())
	}
	for _, g := range []*dist.Grads{params, grads} {
		if g == nil || len(g.Buckets) != len(l.Buckets) || len(g.Params) != len(l.Params) {
			return nil, fmt.Errorf("%w: storage of another layout", ErrConfig)
		}
		for b, t := range g.Buckets {
			if t.DType != tensor.F32 || t.Numel() != l.Buckets[b].Numel {
				return nil, fmt.Errorf("%w: bucket %d is %v ×%d, the layout's %v ×%d (AdamW wants f32)", ErrConfig, b,
					t.DType, t.Numel(), l.Buckets[b].DType, l.Buckets[b].Numel)
			}
		}
	}
	if cfg.NoDecay != nil && len(cfg.NoDecay) != len(l.Params) {
		return nil, fmt.Errorf("%w: NoDecay has %d entries for %d parameters", ErrConfig, len(cfg.NoDecay), len(l.Params))
	}
	o = &AdamW{c: c, l: l, rank: c.Rank(), params: params, segs: l.Segments(c.Rank()), noDecay: cfg.NoDecay}
	defer func() {
		if err != nil {
			o.Free()
			o = nil
		}
	}()
	if len(o.segs) == 0 {
		return o, fmt.Errorf("%w: rank %d of %d holds no parameter in its parts of the buckets (too many ranks for %d parameters)",
			ErrConfig, o.rank, c.Size(), len(l.Params))
	}
	total := 0
	o.base = make([]int, len(l.Buckets))
	for b := range l.Buckets {
		o.base[b] = total
		_, n := l.Part(b, o.rank)
		total += n
	}
	alloc := func(n string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
		t, err := tensor.Alloc(a, optim.BufferName(prefix, n), dt, shape...)
		if err != nil {
			return nil, fmt.Errorf("zero: allocating %s: %w", n, err)
		}
		o.bufs = append(o.bufs, t)
		if err := t.Write(make([]byte, t.Bytes())); err != nil {
			return nil, fmt.Errorf("zero: zeroing %s: %w", n, err)
		}
		return t, nil
	}
	if o.mBuf, err = alloc("exp_avg.shard", tensor.F32, total); err != nil {
		return o, err
	}
	if o.vBuf, err = alloc("exp_avg_sq.shard", tensor.F32, total); err != nil {
		return o, err
	}
	if o.step, err = alloc("step", tensor.I32, 1); err != nil {
		return o, err
	}
	if o.sumsq, err = alloc("work/sumsq", tensor.F32, 1); err != nil {
		return o, err
	}
	var nd []bool
	for _, s := range o.segs {
		off, _ := l.Part(s.Bucket, o.rank)
		at := o.base[s.Bucket] + s.At - off
		view := func(t *tensor.Tensor, lo int) (*tensor.Tensor, error) { return t.Rows(lo, lo+s.Numel) }
		pv, err1 := view(params.Buckets[s.Bucket], s.At)
		gv, err2 := view(grads.Buckets[s.Bucket], s.At)
		mv, err3 := view(o.mBuf, at)
		vv, err4 := view(o.vBuf, at)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return o, err
		}
		o.p, o.g, o.m, o.v = append(o.p, pv), append(o.g, gv), append(o.m, mv), append(o.v, vv)
		nd = append(nd, cfg.NoDecay != nil && cfg.NoDecay[s.Param])
	}
	o.cfg = cfg
	o.cfg.NoDecay = nd
	return o, nil
}

// ClipCoef queues the global gradient norm and the clipping coefficient
// (norm and coef, [1] f32 on the device; pass coef as the configuration's
// GradScale to fuse the clipping into Step): this rank's sum of squares
// over its parts of the buckets, all-reduced (sum) across ranks, then
// ops.Engine.ClipCoefFromSumSquares — torch.nn.utils.clip_grad_norm_'s
// norm of the whole averaged gradient. A collective: every rank calls it,
// after the reducer's Wait.
func (o *AdamW) ClipCoef(e *ops.Engine, maxNorm float32, norm, coef *tensor.Tensor) error {
	if err := e.SumSquares(o.g, o.sumsq); err != nil {
		return err
	}
	if o.c.Size() > 1 {
		if err := o.c.AllReduce(e, o.sumsq, o.sumsq, nccl.Sum); err != nil {
			return fmt.Errorf("zero: the gradient norm's all-reduce: %w", err)
		}
	}
	return e.ClipCoefFromSumSquares(o.sumsq, maxNorm, norm, coef)
}

// Step queues one AdamW update of this rank's parts of the parameters
// (one multi-tensor launch over its segments) and the in-place all-gather
// of every parameter bucket, grouped (ncclGroupStart/End). A collective:
// every rank calls it, after the reducer's Wait (and ClipCoef).
func (o *AdamW) Step(e *ops.Engine) error {
	if err := e.AdamW(o.p, o.g, o.m, o.v, o.step, o.cfg); err != nil {
		return err
	}
	return o.gather(e)
}

// gather all-gathers the parameter buckets in place.
func (o *AdamW) gather(e *ops.Engine) error {
	if o.c.Size() == 1 {
		return nil
	}
	return o.c.Group(e, func() error {
		for b, t := range o.params.Buckets {
			part, err := o.l.PartView(t, b, o.rank)
			if err != nil {
				return err
			}
			if err := o.c.AllGather(e, t, part); err != nil {
				return fmt.Errorf("zero: all-gather of parameter bucket %d: %w", b, err)
			}
		}
		return nil
	})
}

// Counter is the device's i32 step counter ([1], the same on every rank):
// the number of steps taken (dropout keys its masks on it).
func (o *AdamW) Counter() *tensor.Tensor { return o.step }

// SetLR changes the learning rate for later steps.
func (o *AdamW) SetLR(lr float32) { o.cfg.LR = lr }

// SetLRScale sets the device learning-rate scale (nil: none).
func (o *AdamW) SetLRScale(t *tensor.Tensor) { o.cfg.LRScale = t }

// SetGradScale sets the device gradient scale (ClipCoef's coefficient;
// nil: none).
func (o *AdamW) SetGradScale(t *tensor.Tensor) { o.cfg.GradScale = t }

// Config is the configuration, NoDecay per parameter of the layout.
func (o *AdamW) Config() ops.AdamWConfig {
	c := o.cfg
	c.NoDecay = o.noDecay
	return c
}

// StateBytes is the bytes of optimizer state this rank holds (its
// moments and step counter).
func (o *AdamW) StateBytes() int64 { return o.mBuf.Bytes() + o.vBuf.Bytes() + o.step.Bytes() }

// Reset zeroes the moments and the step counter (queued with ops Fill).
func (o *AdamW) Reset(e *ops.Engine) error {
	for _, t := range []*tensor.Tensor{o.mBuf, o.vBuf, o.step} {
		if err := e.Fill(t, 0); err != nil {
			return err
		}
	}
	return nil
}

// Free releases the state (the parameter and gradient storage are the
// caller's).
func (o *AdamW) Free() error {
	var errs []error
	for _, t := range o.bufs {
		errs = append(errs, t.Buf.Free())
	}
	o.bufs = nil
	return errors.Join(errs...)
}

// names are the checkpoint names of parameter i's moments, as
// optim.AdamW names them.
func (o *AdamW) names(i int) [2]string {
	n := o.l.Params[i].Name
	return [2]string{n + ".exp_avg", n + ".exp_avg_sq"}
}

// GatherState assembles the whole state on rank root, as optim.AdamW's
// State lists it: "<param>.exp_avg" and "<param>.exp_avg_sq" per
// parameter in the layout's order (f32, the parameter's shape), then
// "step" ([1] i32) — host tensors the caller frees (Buf.Free), nil on
// the other ranks. A collective (every rank calls it; the host waits for
// the device): per bucket and moment, this rank's part is copied into a
// scratch bucket (allocated through a, the largest bucket's size, freed
// before returning) and all-gathered there.
func (o *AdamW) GatherState(e *ops.Engine, a device.Allocator, root int) (state []nn.Param, err error) {
	if root < 0 || root >= o.c.Size() {
		return nil, fmt.Errorf("%w: gathering the state on rank %d of %d", ErrConfig, root, o.c.Size())
	}
	biggest := 0
	for _, b := range o.l.Buckets {
		biggest = max(biggest, b.Numel)
	}
	scratch, err := tensor.Alloc(a, "", tensor.F32, biggest)
	if err != nil {
		return nil, fmt.Errorf("zero: gathering the optimizer state: %w", err)
	}
	defer scratch.Buf.Free()
	me := o.rank == root
	host := device.Local{Dev: device.NewHost()}
	whole := make([][2]*tensor.Tensor, len(o.l.Params))
	defer func() {
		if err != nil {
			for _, w := range whole {
				for _, t := range w {
					if t != nil {
						t.Buf.Free()
					}
				}
			}
		}
	}()
	for b, bk := range o.l.Buckets {
		full, err := scratch.Rows(0, bk.Numel)
		if err != nil {
			return nil, err
		}
		off, n := o.l.Part(b, o.rank)
		part, err := full.Rows(off, off+n)
		if err != nil {
			return nil, err
		}
		for k, src := range []*tensor.Tensor{o.mBuf, o.vBuf} {
			mine, err := src.Rows(o.base[b], o.base[b]+n)
			if err != nil {
				return nil, err
			}
			if err := e.Copy(part, mine); err != nil {
				return nil, err
			}
			if o.c.Size() > 1 {
				if err := o.c.AllGather(e, full, part); err != nil {
					return nil, fmt.Errorf("zero: gathering the optimizer state of bucket %d: %w", b, err)
				}
			}
			if err := e.Sync(); err != nil {
				return nil, err
			}
			if !me {
				continue
			}
			raw, err := full.Read()
			if err != nil {
				return nil, err
			}
			for _, i := range bk.Params {
				p := o.l.Params[i]
				t, err := tensor.Alloc(host, "", tensor.F32, p.Shape...)
				if err != nil {
					return nil, err
				}
				whole[i][k] = t
				at := o.l.Slots[i].Offset * 4
				if err := t.Write(raw[at : at+int(t.Bytes())]); err != nil {
					return nil, err
				}
			}
		}
	}
	if !me {
		return nil, nil
	}
	for i, w := range whole {
		nm := o.names(i)
		state = append(state, nn.Param{Name: nm[0], Value: w[0]}, nn.Param{Name: nm[1], Value: w[1]})
	}
	step, err := tensor.Alloc(host, "", tensor.I32, 1)
	if err != nil {
		return nil, err
	}
	raw, err := o.step.Read()
	if err == nil {
		err = step.Write(raw)
	}
	if err != nil {
		step.Buf.Free()
		return nil, err
	}
	return append(state, nn.Param{Name: "step", Value: step}), nil
}

// LoadState sets this rank's state from whole tensors under the names
// GatherState (and optim.AdamW.State) gives them: load(name, t) must fill
// t (a host tensor of the parameter's shape, f32; "step": the device
// counter itself, [1] i32), from a checkpoint written at any world size
// (ckpt.File.Load). Only this rank's parts are kept; no communication.
func (o *AdamW) LoadState(load func(name string, t *tensor.Tensor) error) error {
	host := device.Local{Dev: device.NewHost()}
	for si, s := range o.segs {
		p := o.l.Params[s.Param]
		for k, dst := range []*tensor.Tensor{o.m[si], o.v[si]} {
			name := o.names(s.Param)[k]
			t, err := tensor.Alloc(host, "", tensor.F32, p.Shape...)
			if err != nil {
				return err
			}
			err = load(name, t)
			var raw []byte
			if err == nil {
				raw, err = t.Read()
			}
			t.Buf.Free()
			if err != nil {
				return fmt.Errorf("zero: loading %s: %w", name, err)
			}
			if err := dst.Write(raw[s.Offset*4 : (s.Offset+s.Numel)*4]); err != nil {
				return fmt.Errorf("zero: loading %s: %w", name, err)
			}
		}
	}
	if err := load("step", o.step); err != nil {
		return fmt.Errorf("zero: loading step: %w", err)
	}
	return nil
}
