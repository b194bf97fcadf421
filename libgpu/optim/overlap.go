package optim

import (
	"fmt"

	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
)

// splitter is an optimizer whose step splits into a start (once per step,
// on the engine's main stream) and updates of parameter ranges, which
// together compute bitwise what Step computes.
type splitter interface {
	Optimizer
	begin(e *ops.Engine) error
	stepRange(e *ops.Engine, lo, hi int) error
}

func (o *AdamW) begin(e *ops.Engine) error { return e.AdamWAdvance(o.step, o.cfg) }

func (o *AdamW) stepRange(e *ops.Engine, lo, hi int) error {
	return e.AdamWApply(o.s.params[lo:hi], o.s.grads[lo:hi], o.m[lo:hi], o.v[lo:hi], o.step, o.cfg)
}

func (o *SGD) begin(*ops.Engine) error { return nil }

func (o *SGD) stepRange(e *ops.Engine, lo, hi int) error {
	return e.SGD(o.s.params[lo:hi], o.s.grads[lo:hi], o.mom[lo:hi], o.cfg)
}

var (
	_ splitter = (*AdamW)(nil)
	_ splitter = (*SGD)(nil)
)

// BackwardStep runs mlp's backward and then one step of opt, which must have
// been made over mlp.Params() (same order) — the step after the forward
// that the caller queued.
//
// With overlap and an AdamW or SGD opt, each layer's update is queued
// inside ops.Engine.Side: on an engine with a side stream (CUDA) on that
// stream as soon as the backward has made that layer's gradients final
// (nn.MLP.BackwardEach: the last layer first), so it runs concurrently
// with the backward of the layers before it; the main stream joins the
// side stream before BackwardStep returns. AdamW's step counter advances
// once on the main stream before the backward (ops.Engine.AdamWAdvance)
// and every layer's update reads that step. The per-parameter arithmetic
// is that of Step, so the results are bitwise those of the serial order.
// Inside a stream capture the updates become parallel branches of the
// graph. Gradient clipping needs every gradient before any update: callers
// that clip pass overlap false.
//
// On the host the updates run in line in the same order, with the same
// results. Otherwise (no overlap, another optimizer) it is
// mlp.Backward then opt.Step. Errors wrap ErrParams when opt is not over
// mlp.Params(), or the ops' errors.
func BackwardStep(e *ops.Engine, mlp *nn.MLP, opt Optimizer, overlap bool) error {
	sp, ok := opt.(splitter)
	if !overlap || !ok {
		if err := mlp.Backward(e); err != nil {
			return err
		}
		return opt.Step(e)
	}
	if err := sameParams(sp, mlp.Params()); err != nil {
		return err
	}
	if err := sp.begin(e); err != nil {
		return err
	}
	err := mlp.BackwardEach(e, func(layer int) error {
		return e.Side(func() error { return sp.stepRange(e, 2*layer, 2*layer+2) })
	})
	// Join even after an error: a side stream left forked fails a capture.
	if jerr := e.Join(); err == nil {
		err = jerr
	}
	return err
}

// sameParams checks that the optimizer updates exactly ps, in order.
func sameParams(o Optimizer, ps []nn.Param) error {
	var s *state
	switch o := o.(type) {
	case *AdamW:
		s = &o.s
	case *SGD:
		s = &o.s
	}
	if s == nil || len(s.params) != len(ps) {
		return fmt.Errorf("%w: the optimizer is not over the model's %d parameters", ErrParams, len(ps))
	}
	for i, p := range ps {
		if s.params[i] != p.Value || s.grads[i] != p.Grad {
			return fmt.Errorf("%w: optimizer parameter %d is not the model's %q", ErrParams, i, p.Name)
		}
	}
	return nil
}
