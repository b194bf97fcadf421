package cudaev

import (
	"errors"

	"gpukit/libgpu/cuda"
)

// Stream is trace.GPUEvents for stream s of context ctx: events made
// with cuEventCreate(CU_EVENT_DEFAULT) (timing on), recorded on s.
type Stream struct {
	ctx *cuda.Context
	s   cuda.Stream
}

// New returns the events of stream s in ctx (not nil; Bind fails without
// it). The events are made on the calling goroutine's thread, which must
// have ctx current when NewEvent is called there.
func New(ctx *cuda.Context, s cuda.Stream) *Stream { return &Stream{ctx: ctx, s: s} }

// Bind makes ctx current on the calling OS thread (cuCtxSetCurrent).
func (e *Stream) Bind() error {
	if e.ctx == nil {
		return errors.New("cudaev: nil context")
	}
	return e.ctx.SetCurrent()
}

// NewEvent creates a timing event (cuEventCreate).
func (e *Stream) NewEvent() (uintptr, error) {
	ev, err := cuda.EventCreate(cuda.EventDefault)
	return uintptr(ev), err
}

// Record enqueues ev on the stream (cuEventRecord).
func (e *Stream) Record(ev uintptr) error { return cuda.Event(ev).Record(e.s) }

// Query reports whether ev has completed (cuEventQuery; never waits).
func (e *Stream) Query(ev uintptr) (bool, error) { return cuda.Event(ev).Query() }

// Elapsed is the time from start to end in ms (cuEventElapsedTime).
func (e *Stream) Elapsed(start, end uintptr) (float32, error) {
	return cuda.EventElapsed(cuda.Event(start), cuda.Event(end))
}

// Destroy frees ev (cuEventDestroy).
func (e *Stream) Destroy(ev uintptr) { cuda.Event(ev).Destroy() }
