package nccl

import (
	"fmt"
	"slices"

	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// Reducer all-reduces gradient buckets (dist.Layout) while the backward
// is still running, as PyTorch's DDP does: the training step marks each
// parameter's gradient Ready once the backward has queued its last write;
// when that completes a bucket, the bucket's all-reduce is queued on the
// engine's communication stream (Engine.CommSide), forked at that point
// from the main stream and from the side stream (where the backward may
// have queued the bucket's weight gradients), so it overlaps the rest of
// the backward without waiting behind, or holding up, the side stream's
// work; Wait queues what is left and joins the communication stream
// before the optimizer. Buckets are reduced in bucket order (a bucket completed early waits for the ones before it), so
// every rank issues the same collectives in the same order, as NCCL
// requires. All of it is host-side bookkeeping at queue time: a step
// captured in a CUDA graph (Engine.Capture) replays the forks, all-reduces
// and join as recorded.
//
// The backward must not write a gradient after marking it ready, nor read
// a bucket's gradients between their all-reduce's fork and Wait. Gradient
// accumulation over micro-batches marks only on the last one.
//
// Compress makes the f32 buckets travel in bf16 (half the bytes), as
// PyTorch DDP's bf16_compress_hook does. Scatter makes the reducer
// reduce-scatter the buckets instead (ZeRO-1: each rank receives the
// reduction of its part of every bucket only).
type Reducer struct {
	c  Collective
	e  *ops.Engine
	l  *dist.Layout
	g  *dist.Grads
	op Op

	left  []int  // per bucket: gradients not marked yet this step
	ready []bool // per parameter
	next  int    // the first bucket not issued yet

	// collective queues the reduction of bucket b, held in t (the bucket
	// or its staging copy), on the communication stream inside CommSide:
	// an in-place all-reduce, or with scatter a reduce-scatter into
	// this rank's part of t; tests replace it. skip: a communicator of one
	// rank, whose reductions change nothing, needs neither them nor the
	// communication stream.
	collective func(b int, t *tensor.Tensor) error
	skip       bool
	scatter    bool

	// stage: per bucket, its compressed copy (Compress), or nil where the
	// bucket is reduced in place; in stageBuf.
	stage    []*tensor.Tensor
	stageBuf *device.Buffer
}

// Collective is what a Reducer needs of its communicator: a *Comm, or a
// stand-in that reduces another way (an in-process fake of several ranks
// on the host, in tests of code built on the Reducer).
type Collective interface {
	// AllReduce as Comm.AllReduce.
	AllReduce(e *ops.Engine, dst, src *tensor.Tensor, op Op) error
	// IsSolo: one rank, nothing to reduce (the Reducer then queues no
	// all-reduce and uses no communication stream).
	IsSolo() bool
}

// ShardCollective is a Collective that can also reduce-scatter and
// all-gather, and says where it stands: what ZeRO-1 needs (Reducer.Scatter,
// libgpu/zero). *Comm is one; tests use an in-process stand-in.
type ShardCollective interface {
	Collective
	// ReduceScatter and AllGather as Comm's.
	ReduceScatter(e *ops.Engine, dst, src *tensor.Tensor, op Op) error
	AllGather(e *ops.Engine, dst, src *tensor.Tensor) error
	Rank() int
	Size() int
}

var _ ShardCollective = (*Comm)(nil)

// NewReducer makes a reducer of g's buckets (laid out by l) over c, queued
// on e, reducing with op (Avg: the gradient of the mean loss over the
// global batch when every rank's loss is its local mean).
func NewReducer(e *ops.Engine, c Collective, l *dist.Layout, g *dist.Grads, op Op) (*Reducer, error) {
	if len(g.Buckets) != len(l.Buckets) || len(g.Params) != len(l.Params) {
		return nil, fmt.Errorf("%w: %d bucket tensors for %d buckets", ErrArg, len(g.Buckets), len(l.Buckets))
	}
	if err := checkOp("reducer", op); err != nil {
		return nil, err
	}
	r := &Reducer{c: c, e: e, l: l, g: g, op: op, left: make([]int, len(l.Buckets)), ready: make([]bool, len(l.Params))}
	r.collective = r.allReduce
	r.skip = c.IsSolo()
	r.Reset()
	return r, nil
}

// allReduce reduces bucket b's t in place.
func (r *Reducer) allReduce(_ int, t *tensor.Tensor) error { return r.c.AllReduce(r.e, t, t, r.op) }

// reduceScatter reduces bucket b's t into this rank's part of t (NCCL's
// in-place reduce-scatter: the destination is the rank's part of the
// source).
func (r *Reducer) reduceScatter(b int, t *tensor.Tensor) error {
	sc := r.c.(ShardCollective)
	part, err := r.l.PartView(t, b, sc.Rank())
	if err != nil {
		return err
	}
	return sc.ReduceScatter(r.e, part, t, r.op)
}

// Scatter makes the reducer reduce-scatter each bucket where it would
// all-reduce it (on = true), or all-reduce again (false): ZeRO stage 1
// (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", SC 2020, §5.1: the optimizer state split
// into one partition per rank, the gradients reduce-scattered so each
// rank holds the reduced gradients of its partition, the updated
// parameters all-gathered). After Wait, rank r's part of every bucket
// (dist.Layout.Part) holds the reduction over all ranks of that part; the
// rest of each bucket still holds this rank's own gradients, unreduced.
// A ring reduce-scatter moves (n−1)/n of a bucket per rank, half of an
// all-reduce. With Compress the bf16 staging copy is reduce-scattered and
// only the rank's part cast back. The layout must be cut into as many
// parts as the communicator has ranks (dist.BucketConfig.Shards), and the
// communicator must be a ShardCollective. One rank reduces nothing either
// way. Call between steps. Errors: ErrArg.
func (r *Reducer) Scatter(on bool) error {
	if slices.Contains(r.ready, true) || r.next != 0 {
		return fmt.Errorf("%w: reducer: Scatter during a step", ErrArg)
	}
	if !on {
		r.scatter, r.collective = false, r.allReduce
		return nil
	}
	sc, ok := r.c.(ShardCollective)
	if !ok {
		return fmt.Errorf("%w: reducer: %T cannot reduce-scatter", ErrArg, r.c)
	}
	if r.l.Shards != sc.Size() {
		return fmt.Errorf("%w: reducer: buckets cut into %d parts for %d ranks (dist.BucketConfig.Shards)", ErrArg, r.l.Shards, sc.Size())
	}
	r.scatter, r.collective = true, r.reduceScatter
	return nil
}

// Reset forgets the marks of the current step (a step abandoned before
// Wait); Wait does it itself.
func (r *Reducer) Reset() {
	for b := range r.l.Buckets {
		r.left[b] = len(r.l.Buckets[b].Params)
	}
	clear(r.ready)
	r.next = 0
}

// Ready marks parameters' gradients final for this step (their last write
// is queued on the engine's main stream) and queues the all-reduce of
// every bucket that is now complete and next in order. Errors: ErrArg for
// an unknown parameter or one marked twice in a step; the collective's
// errors.
func (r *Reducer) Ready(params ...int) error {
	for _, i := range params {
		if i < 0 || i >= len(r.ready) {
			return fmt.Errorf("%w: reducer: parameter %d of %d", ErrArg, i, len(r.ready))
		}
		if r.ready[i] {
			return fmt.Errorf("%w: reducer: %s marked ready twice in one step", ErrArg, r.l.Params[i].Name)
		}
		r.ready[i] = true
		r.left[r.l.Slots[i].Bucket]--
	}
	return r.issue(false)
}

// issue queues, in order, the buckets from next on that are complete (all
// of them with all).
func (r *Reducer) issue(all bool) error {
	for r.next < len(r.left) && (all || r.left[r.next] == 0) {
		b := r.next
		if r.skip {
			r.next++
			continue
		}
		if err := r.e.CommSide(func() error { return r.reduce(b) }); err != nil {
			return fmt.Errorf("nccl: reducer: bucket %d (%s, %d bytes): %w", b, r.l.Params[r.l.Buckets[b].Params[0]].Name,
				r.l.Buckets[b].Bytes(), err)
		}
		r.next++
	}
	return nil
}

// reduce queues bucket b's reduction (inside CommSide): in place, or,
// compressed, the cast of the bucket into its staging copy, the staging
// copy's all-reduce and the cast back into the bucket.
func (r *Reducer) reduce(b int) error {
	t := r.g.Buckets[b]
	var s *tensor.Tensor
	if r.stage != nil {
		s = r.stage[b]
	}
	if s == nil {
		return r.collective(b, t)
	}
	if err := r.e.Cast(s, t); err != nil {
		return err
	}
	if err := r.collective(b, s); err != nil {
		return err
	}
	if r.scatter {
		rank := r.c.(ShardCollective).Rank()
		tp, err := r.l.PartView(t, b, rank)
		if err != nil {
			return err
		}
		sp, err := r.l.PartView(s, b, rank)
		if err != nil {
			return err
		}
		t, s = tp, sp
	}
	return r.e.Cast(t, s)
}

// Compress makes the reducer communicate its f32 buckets in dt: BF16, or
// F32 to communicate them as they are again. Each f32 bucket's reduction
// becomes three operations on the communication stream, queued where its
// all-reduce was: a cast of the bucket into a bf16 staging copy (one
// launch, round to nearest even), the all-reduce of the copy with the
// reducer's op in bf16, and a cast back into the f32 bucket (exact) —
// PyTorch DDP's bf16_compress_hook (torch/distributed/algorithms/
// ddp_comm_hooks/default_hooks.py, _compress_hook: the bucket cast to
// bf16 and divided by the world size, all-reduced with sum, copied back
// into the bucket). With Avg that division is NCCL's own: for floating-
// point types ncclAvg multiplies each rank's input by 1/Size() in the
// dtype before summing (ncclDevPreMulSum; NCCL's enqueue.cc,
// hostToDevRedOp), which is PyTorch's pre-division (the same numbers for a
// power-of-two world, where 1/Size() is exact). The sum is then carried
// in bf16, which keeps 8 significant bits (a rounding moves a value by at
// most 2⁻⁸ of itself): each rank's gradient rounded once, each of the
// Size() − 1 additions rounding a partial sum, so an element of the
// result is within about Size()·2⁻⁸·S of its f32 average, S = Σᵣ|gᵣ|/Size()
// (not of the average itself, where the ranks' gradients cancel), and the
// same on every rank. Buckets of other dtypes are reduced in place as
// before.
//
// The staging copies are allocated once, here, through a (named name),
// half the bytes of the f32 buckets; Free frees them. A reducer of one
// rank (IsSolo) reduces nothing and allocates nothing. Call Compress
// between steps (no gradient marked). Errors: ErrArg for another dtype
// or a step under way; the allocator's.
func (r *Reducer) Compress(a device.Allocator, name string, dt tensor.DType) error {
	if dt != tensor.BF16 && dt != tensor.F32 {
		return fmt.Errorf("%w: reducer: compressing gradients to %v (want bf16, or f32 for none)", ErrArg, dt)
	}
	if slices.Contains(r.ready, true) || r.next != 0 {
		return fmt.Errorf("%w: reducer: Compress during a step", ErrArg)
	}
	if err := r.Free(); err != nil {
		return err
	}
	if dt == tensor.F32 || r.skip {
		return nil
	}
	align := r.l.Align
	offs := make([]int64, len(r.l.Buckets))
	total := int64(0)
	for b, bk := range r.l.Buckets {
		offs[b] = -1
		if bk.DType != tensor.F32 {
			continue
		}
		offs[b] = total
		total += (int64(bk.Numel)*int64(dt.Size()) + align - 1) / align * align
	}
	if total == 0 {
		return nil
	}
	buf, err := a.Alloc(name, total)
	if err != nil {
		return fmt.Errorf("nccl: reducer: %v staging of the gradient buckets (%d bytes): %w", dt, total, err)
	}
	r.stageBuf, r.stage = buf, make([]*tensor.Tensor, len(r.l.Buckets))
	for b, bk := range r.l.Buckets {
		if offs[b] >= 0 {
			r.stage[b] = &tensor.Tensor{Buf: buf, DType: dt, Shape: []int{bk.Numel}, Strides: []int{1}, Offset: int(offs[b]) / dt.Size()}
		}
	}
	return nil
}

// Free frees Compress's staging copies (the reducer then reduces every
// bucket in place). The reducer's work queued so far must have run.
func (r *Reducer) Free() error {
	buf := r.stageBuf
	r.stage, r.stageBuf = nil, nil
	if buf == nil {
		return nil
	}
	return buf.Free()
}

// Wait queues the all-reduce of the buckets not queued yet (gradients never
// marked: parameters the step did not use, whose gradients must hold zeros
// or their value) and joins the communication stream: work queued after Wait (the
// optimizer, a gradient-norm clip) sees reduced gradients. It then resets
// the marks for the next step.
func (r *Reducer) Wait() error {
	err := r.issue(true)
	if !r.skip {
		if jerr := r.e.JoinComm(); err == nil {
			err = jerr
		}
	}
	r.Reset()
	return err
}
