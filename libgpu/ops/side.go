package ops

// The side stream: work queued off the engine's main stream, ordered with
// it by fork and join events, so that long computations (second-order
// optimizers' matrix roots) run concurrently with the step's kernels. On
// CUDA the side stream has its own cuBLASLt workspace and its own scratch
// buffers, so every op that needs only those may run there (GEMMs, the
// matrix-root and eigensolver families, element-wise kernels); ops that
// use the backend's small shared device state (AdamW's bias corrections,
// the cross-entropy ticket counter) refuse with ErrSide. The host backend
// has no second stream: Side runs its function in line.
//
// This revives the Engine.Side/Join of commit 203d962 (reverted), with a
// workspace and scratch namespace of the side stream's own instead of
// refusing GEMMs there, and adds WaitEvent and Event.Query so that a
// caller can join one piece of side work at a later step of its choosing
// (bounded staleness) rather than everything at once.

import (
	"errors"
	"fmt"

	"gpukit/libgpu/cuda"
)

// ErrSide: an op that uses the backend's shared device state was queued
// inside Engine.Side (it could race with the main stream's use of it), or
// Side was nested, or Join was called inside Side.
var ErrSide = errors.New("ops: op not allowed on the side stream")

// sideState is the CUDA backend's side stream, created on first use: the
// stream, its workspace, and the fork and join events (reused: a wait
// follows the event's latest record at the time of the wait, in eager runs
// and in captures).
type sideState struct {
	stream      cuda.Stream
	ws          cuda.DevicePtr
	fork, join  cuda.Event
	main        cuda.Stream // the main stream, while on the side
	mainWS      cuda.DevicePtr
	on, pending bool
}

// HasSide reports whether the backend has a side stream, so that ops
// queued inside Side run concurrently with later ops on the main stream
// (CUDA).
func (e *Engine) HasSide() bool {
	_, ok := e.impl.(*cudaImpl)
	return ok
}

// Side queues fn's ops on the backend's side stream, after everything
// queued so far on the engine's main stream (a fork: an event recorded on
// the main stream, which the side stream waits for). Ops queued after Side
// returns go to the main stream again and may run concurrently with fn's;
// Join, or WaitEvent on an Event recorded inside fn, makes the main stream
// wait for them. Inside a stream capture of the main stream, the fork and
// join become parallel branches of the captured graph (CUDA Programming
// Guide, "Cross-stream Dependencies and Events" under stream capture), and
// the capture must join the side stream before it ends.
//
// fn must not touch tensors the main stream writes before the join. Ops
// that use shared backend state (AdamW, SoftmaxCrossEntropy) fail with
// ErrSide inside fn, as does a nested Side. The host backend runs fn in
// line.
func (e *Engine) Side(fn func() error) error {
	c, ok := e.impl.(*cudaImpl)
	if !ok {
		return fn()
	}
	return c.dev.Do(func() error { return c.sideRun(fn) })
}

// Join makes the engine's main stream wait for every op queued by Side so
// far. A Join with nothing pending does nothing.
func (e *Engine) Join() error {
	c, ok := e.impl.(*cudaImpl)
	if !ok {
		return nil
	}
	return c.dev.Do(c.sideJoin)
}

// WaitEvent makes later ops queued on the engine's current stream (the
// main stream, or the side stream inside Side) wait until the work before
// v's last Record has run (cuStreamWaitEvent: the host does not block).
// Recording v inside Side and waiting for it later on the main stream
// joins exactly that piece of side work. On the host it does nothing.
func (e *Engine) WaitEvent(v *Event) error {
	if v == nil {
		return fmt.Errorf("%w: wait for a nil event", ErrConfig)
	}
	c, ok := e.impl.(*cudaImpl)
	if !ok || v.ev == 0 {
		return nil
	}
	return c.dev.Do(func() error { return c.stream.WaitEvent(v.ev) })
}

// Query reports, without blocking, whether the work queued before v's last
// Record has finished (true on the host, and for an event never recorded).
func (v *Event) Query() (bool, error) {
	if v.ev == 0 {
		return true, nil
	}
	var done bool
	err := v.e.Do(func() error {
		var err error
		done, err = v.ev.Query()
		return err
	})
	return done, err
}

// onSide reports whether ops are being queued on the side stream (inside
// Side); ops that use shared backend state refuse then.
func (c *cudaImpl) onSide() bool { return c.side.on }

// sideInit creates the side stream, its workspace and events. Inside Do.
func (c *cudaImpl) sideInit() error {
	s := &c.side
	if s.stream != 0 {
		return nil
	}
	var err error
	if s.fork, err = cuda.EventCreate(cuda.EventDisableTiming); err != nil {
		return err
	}
	if s.join, err = cuda.EventCreate(cuda.EventDisableTiming); err != nil {
		return err
	}
	if s.ws, err = cuda.MemAlloc(cudaWorkspace); err != nil {
		return err
	}
	s.stream, err = cuda.StreamCreate(true)
	return err
}

// sideRun implements Side. Inside Do.
func (c *cudaImpl) sideRun(fn func() error) error {
	s := &c.side
	if s.on {
		return fmt.Errorf("%w: nested Side", ErrSide)
	}
	if err := c.sideInit(); err != nil {
		return fmt.Errorf("ops: side stream: %w", err)
	}
	if err := s.fork.Record(c.stream); err != nil {
		return fmt.Errorf("ops: fork: %w", err)
	}
	if err := s.stream.WaitEvent(s.fork); err != nil {
		return fmt.Errorf("ops: fork: %w", err)
	}
	s.pending = true
	s.main, s.mainWS = c.stream, c.ws
	c.stream, c.ws, s.on = s.stream, s.ws, true
	defer func() { c.stream, c.ws, s.on = s.main, s.mainWS, false }()
	return fn()
}

// sideJoin implements Join. Inside Do.
func (c *cudaImpl) sideJoin() error {
	s := &c.side
	if s.on {
		return fmt.Errorf("%w: Join inside Side", ErrSide)
	}
	if !s.pending {
		return nil
	}
	if err := s.join.Record(s.stream); err != nil {
		return fmt.Errorf("ops: join: %w", err)
	}
	if err := c.stream.WaitEvent(s.join); err != nil {
		return fmt.Errorf("ops: join: %w", err)
	}
	s.pending = false
	return nil
}

// sideClose waits for the side stream and frees what sideInit made. Inside
// Do, from Close.
func (c *cudaImpl) sideClose(keep func(error)) {
	s := &c.side
	if s.stream != 0 {
		keep(s.stream.Synchronize())
		keep(s.stream.Destroy())
	}
	for _, ev := range []cuda.Event{s.fork, s.join} {
		if ev != 0 {
			keep(ev.Destroy())
		}
	}
	if s.ws != 0 {
		keep(cuda.MemFree(s.ws))
	}
	*s = sideState{}
}

// sideScratch is the scratch slot name for name on the current stream:
// the side stream's scratch is its own, so the two streams never share a
// scratch buffer.
func (c *cudaImpl) sideScratch(name string) string {
	if c.side.on {
		return "side/" + name
	}
	return name
}
