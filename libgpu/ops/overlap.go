package ops

import (
	"errors"
	"fmt"

	"gpukit/libgpu/tensor"
)

// ErrSide: an op that needs the backend's scratch memory (or a nested
// Side) was queued inside Engine.Side, where it could race with the main
// stream's use of the same scratch.
var ErrSide = errors.New("ops: op not allowed on the side stream")

// sider is implemented by backends with a second stream (CUDA). Backends
// without one (host) run Side's function in line and need no join.
type sider interface {
	side(fn func() error) error
	join() error
}

// splitAdamW is implemented by backends that can split AdamW into the step
// counter's advance and updates of parameter subsets (host and CUDA).
type splitAdamW interface {
	adamWAdvance(step *tensor.Tensor, cfg AdamWConfig) error
	adamWApply(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamWConfig) error
}

// HasSide reports whether the backend has a side stream, so that ops queued
// inside Side run concurrently with later ops on the main stream (CUDA).
func (e *Engine) HasSide() bool {
	_, ok := e.impl.(sider)
	return ok
}

// Side queues fn's ops on the backend's side stream, after everything
// queued so far on the engine's stream (a fork: an event recorded on the
// main stream, which the side stream waits for). Ops queued after Side
// returns go to the main stream again and may run concurrently with fn's;
// Join makes the main stream wait for all of them. Inside a stream capture
// of the main stream, the fork and join become parallel branches of the
// captured graph (CUDA Programming Guide, "Cross-stream Dependencies and
// Events" under CUDA Graphs / stream capture).
//
// Only ops that use no backend scratch may run inside fn: AdamWApply, SGD,
// AdamW and Fill. Others fail with ErrSide, as does a nested Side. fn must
// not touch tensors the main stream writes before the next Join. Backends
// without a side stream (host) run fn in line.
func (e *Engine) Side(fn func() error) error {
	if s, ok := e.impl.(sider); ok {
		return s.side(fn)
	}
	return fn()
}

// Join makes the engine's stream wait for every op queued by Side so far.
// Call it before the work of a step is complete (before a stream capture
// ends: an unjoined side stream fails EndCapture). A Join with nothing
// pending does nothing.
func (e *Engine) Join() error {
	if s, ok := e.impl.(sider); ok {
		return s.join()
	}
	return nil
}

// AdamWAdvance is the first half of AdamW split per parameter group: it
// increments the i32 step counter to t and, on a GPU, stores the bias
// corrections 1−β1ᵗ, 1−β2ᵗ in the backend's state for the AdamWApply calls
// of this step. Together, AdamWAdvance followed by AdamWApply over every
// parameter (in any grouping, on either stream) computes bitwise what one
// AdamW call computes. Between AdamWAdvance and the last AdamWApply of a
// step no other AdamW or AdamWAdvance may be queued on the engine (the bias
// corrections are per engine). Errors as AdamW; ErrNoBackend when the
// backend cannot split AdamW.
func (e *Engine) AdamWAdvance(step *tensor.Tensor, cfg AdamWConfig) error {
	if err := e.checkAdamW(nil, nil, nil, nil, step, cfg); err != nil {
		return err
	}
	s, ok := e.impl.(splitAdamW)
	if !ok {
		return fmt.Errorf("%w: %v cannot split AdamW", ErrNoBackend, e.dev)
	}
	return s.adamWAdvance(step, cfg)
}

// AdamWApply is the second half of AdamW: it updates params[i] in place as
// AdamW does, with the step t that the last AdamWAdvance set (step is not
// changed). It may run inside Side. Shapes and errors as AdamW.
func (e *Engine) AdamWApply(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamWConfig) error {
	if err := e.checkAdamW(params, grads, m, v, step, cfg); err != nil {
		return err
	}
	s, ok := e.impl.(splitAdamW)
	if !ok {
		return fmt.Errorf("%w: %v cannot split AdamW", ErrNoBackend, e.dev)
	}
	return s.adamWApply(params, grads, m, v, step, cfg)
}
