package nccl

import (
	"fmt"

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
type Reducer struct {
	c  Collective
	e  *ops.Engine
	l  *dist.Layout
	g  *dist.Grads
	op Op

	left  []int  // per bucket: gradients not marked yet this step
	ready []bool // per parameter
	next  int    // the first bucket not issued yet

	// allReduce queues one bucket's reduction (on the communication
	// stream, inside CommSide); tests replace it. skip: a communicator of
	// one rank, whose reductions change nothing, needs neither them nor
	// the communication stream.
	allReduce func(b int, t *tensor.Tensor) error
	skip      bool
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
	r.allReduce = func(_ int, t *tensor.Tensor) error { return c.AllReduce(e, t, t, op) }
	r.skip = c.IsSolo()
	r.Reset()
	return r, nil
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
		t := r.g.Buckets[b]
		if err := r.e.CommSide(func() error { return r.allReduce(b, t) }); err != nil {
			return fmt.Errorf("nccl: reducer: bucket %d (%s, %d bytes): %w", b, r.l.Params[r.l.Buckets[b].Params[0]].Name,
				r.l.Buckets[b].Bytes(), err)
		}
		r.next++
	}
	return nil
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
