package exec

// The side stream: work queued off the engine's main stream, ordered with
// it by fork and join events, so that long computations (second-order
// optimizers' matrix roots) run concurrently with the step's kernels. On
// CUDA the side stream has its own cuBLASLt workspace and its own scratch
// buffers, so every op that needs only those may run there (GEMMs, the
// matrix-root and eigensolver families, element-wise kernels); ops that
// use the small state an op family shares across streams (AdamW's bias
// corrections, the cross-entropy ticket counter) refuse with ErrSide
// (CUDA.OnSide). The host backend has no second stream: Side runs its
// function in line.
//
// This revives the Engine.Side/Join of commit 203d962 (reverted), with a
// workspace and scratch namespace of the side stream's own instead of
// refusing GEMMs there, and adds WaitEvent and Event.Query so that a
// caller can join one piece of side work at a later step of its choosing
// (bounded staleness) rather than everything at once.
//
// The communication stream (CommSide, JoinComm) is a third stream, of the
// same kind, for collectives: a bucket's all-reduce queued there during
// the backward (nccl.Reducer) neither waits behind the weight gradients
// the backward queues on the side stream nor holds them up, as PyTorch's
// DDP keeps NCCL's work on a stream of its own
// (ProcessGroupNCCL's per-device NCCL streams).

import (
	"errors"
	"fmt"

	"gpukit/libgpu/cuda"
)

// ErrSide: an op that uses the backend's shared device state was queued
// inside Engine.Side (it could race with the main stream's use of it), or
// Side was nested, or Join was called inside Side.
var ErrSide = errors.New("exec: op not allowed on the side stream")

// sideState is the CUDA backend's side stream, created on first use: the
// stream, its workspace, and the fork and join events (reused: a wait
// follows the event's latest record at the time of the wait, in eager runs
// and in captures).
type sideState struct {
	stream      cuda.Stream
	ws          cuda.DevicePtr
	fork, join  cuda.Event
	forkSide    cuda.Event  // the communication stream's fork from the side stream
	main        cuda.Stream // the main stream, while on the side
	mainWS      cuda.DevicePtr
	on, pending bool
}

// HasSide reports whether the backend has a side stream, so that ops
// queued inside Side run concurrently with later ops on the main stream
// (CUDA).
func (e *Engine) HasSide() bool { return e.cuda != nil }

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
// that use state shared across streams (AdamW) fail with
// ErrSide inside fn, as does a nested Side. The host backend runs fn in
// line.
func (e *Engine) Side(fn func() error) error {
	c := e.cuda
	if c == nil {
		return fn()
	}
	return c.Do(func() error { return c.sideRun(fn) })
}

// Join makes the engine's main stream wait for every op queued by Side so
// far. A Join with nothing pending does nothing.
func (e *Engine) Join() error {
	c := e.cuda
	if c == nil {
		return nil
	}
	return c.Do(c.sideJoin)
}

// CommSide queues fn's ops — collectives, typically — on the backend's
// communication stream, after everything queued so far on the engine's
// main stream and on its side stream (a fork from both: a gradient's last
// write may be a weight-gradient product Side queued). Ops queued after
// CommSide returns, on either stream, may run concurrently with fn's;
// JoinComm makes the main stream wait for them (Join does not). Inside a
// capture the forks and the join become parallel branches of the graph,
// as with Side, and the capture must join the communication stream
// before it ends. The rules of Side hold (no shared backend state, no
// nesting in Side or CommSide). The host backend runs fn in line.
func (e *Engine) CommSide(fn func() error) error {
	c := e.cuda
	if c == nil {
		return fn()
	}
	return c.Do(func() error { return c.commRun(fn) })
}

// JoinComm makes the engine's main stream wait for every op queued by
// CommSide so far. With nothing pending it does nothing.
func (e *Engine) JoinComm() error {
	c := e.cuda
	if c == nil {
		return nil
	}
	return c.Do(func() error { return c.join(&c.comm, "JoinComm") })
}

// OnSide reports whether work is being queued off the main stream (inside
// Side or CommSide); ops that use state shared across streams refuse then
// with ErrSide.
func (c *CUDA) OnSide() bool { return c.side.on || c.comm.on }

// sideInit creates s's stream, its workspace and events. Inside Do.
func (c *CUDA) sideInit(s *sideState) error {
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
	if s.forkSide, err = cuda.EventCreate(cuda.EventDisableTiming); err != nil {
		return err
	}
	if s.ws, err = cuda.MemAlloc(WorkspaceSize); err != nil {
		return err
	}
	if s == &c.comm && c.highComm {
		_, greatest, err := cuda.StreamPriorityRange()
		if err != nil {
			return err
		}
		s.stream, err = cuda.StreamCreateWithPriority(true, greatest)
		return err
	}
	s.stream, err = cuda.StreamCreate(true)
	return err
}

// sideRun implements Side. Inside Do.
func (c *CUDA) sideRun(fn func() error) error {
	if c.side.on || c.comm.on {
		return fmt.Errorf("%w: nested Side", ErrSide)
	}
	return c.offMain(&c.side, "side", fn)
}

// commRun implements CommSide: the fork from the main stream, and from the
// side stream when it has work the main stream has not joined. Inside Do.
func (c *CUDA) commRun(fn func() error) error {
	if c.side.on || c.comm.on {
		return fmt.Errorf("%w: nested CommSide", ErrSide)
	}
	if err := c.sideInit(&c.comm); err != nil {
		return fmt.Errorf("exec: communication stream: %w", err)
	}
	if c.side.pending {
		if err := c.comm.forkSide.Record(c.side.stream); err != nil {
			return fmt.Errorf("exec: fork from the side stream: %w", err)
		}
		if err := c.comm.stream.WaitEvent(c.comm.forkSide); err != nil {
			return fmt.Errorf("exec: fork from the side stream: %w", err)
		}
	}
	return c.offMain(&c.comm, "communication", fn)
}

// offMain forks s from the main stream and runs fn with s's stream and
// workspace in the main ones' place. Inside Do.
func (c *CUDA) offMain(s *sideState, what string, fn func() error) error {
	if err := c.sideInit(s); err != nil {
		return fmt.Errorf("exec: %s stream: %w", what, err)
	}
	if err := s.fork.Record(c.stream); err != nil {
		return fmt.Errorf("exec: fork: %w", err)
	}
	if err := s.stream.WaitEvent(s.fork); err != nil {
		return fmt.Errorf("exec: fork: %w", err)
	}
	s.pending = true
	s.main, s.mainWS = c.stream, c.ws
	c.stream, c.ws, s.on = s.stream, s.ws, true
	defer func() { c.stream, c.ws, s.on = s.main, s.mainWS, false }()
	return fn()
}

// sideJoin implements Join. Inside Do.
func (c *CUDA) sideJoin() error { return c.join(&c.side, "Join") }

// join makes the main stream wait for s's work. Inside Do.
func (c *CUDA) join(s *sideState, what string) error {
	if c.side.on || c.comm.on {
		return fmt.Errorf("%w: %s inside Side or CommSide", ErrSide, what)
	}
	if !s.pending {
		return nil
	}
	if err := s.join.Record(s.stream); err != nil {
		return fmt.Errorf("exec: join: %w", err)
	}
	if err := c.stream.WaitEvent(s.join); err != nil {
		return fmt.Errorf("exec: join: %w", err)
	}
	s.pending = false
	return nil
}

// sideClose waits for the side and communication streams and frees what
// sideInit made. Inside Do, from Close.
func (c *CUDA) sideClose(keep func(error)) {
	for _, s := range []*sideState{&c.side, &c.comm} {
		if s.stream != 0 {
			keep(s.stream.Synchronize())
			keep(s.stream.Destroy())
		}
		for _, ev := range []cuda.Event{s.fork, s.join, s.forkSide} {
			if ev != 0 {
				keep(ev.Destroy())
			}
		}
		if s.ws != 0 {
			keep(cuda.MemFree(s.ws))
		}
		*s = sideState{}
	}
}

// sideScratch is the scratch slot name for name on the current stream:
// the side and communication streams' scratch is their own, so no two
// streams share a scratch buffer.
func (c *CUDA) sideScratch(name string) string {
	if c.lanes.set != nil {
		name = fmt.Sprintf("lane%d/%s", c.lanes.cur, name)
	}
	switch {
	case c.side.on:
		return "side/" + name
	case c.comm.on:
		return "comm/" + name
	}
	return name
}

// CommStreamPriority is the priority of the communication stream (made by
// the first CommSide) and the context's greatest priority, for checking
// Options.HighPriorityComm; 0, 0 on the host.
func (e *Engine) CommStreamPriority() (prio, greatest int, err error) {
	c := e.cuda
	if c == nil {
		return 0, 0, nil
	}
	err = c.Do(func() error {
		var err error
		if prio, err = c.comm.stream.Priority(); err != nil {
			return err
		}
		_, greatest, err = cuda.StreamPriorityRange()
		return err
	})
	return prio, greatest, err
}
