package exec

import (
	"fmt"

	"gpukit/libgpu/cuda"
)

// Event marks a point in the engine's queue.
type Event struct {
	e  *Engine
	ev cuda.Event
}

// NewEvent returns an event; timing events can measure elapsed time
// between two of them (Elapsed).
func (e *Engine) NewEvent(timing bool) (*Event, error) {
	c := e.cuda
	if c == nil {
		return &Event{e: e}, nil
	}
	flags := cuda.EventDisableTiming
	if timing {
		flags = cuda.EventDefault
	}
	var ev cuda.Event
	err := c.Do(func() error {
		var err error
		ev, err = cuda.EventCreate(flags)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Event{e: e, ev: ev}, nil
}

// Record marks the current end of the engine's queue (inside Side, of the
// side stream's).
func (v *Event) Record() error {
	if v.ev == 0 {
		return nil
	}
	c := v.e.cuda
	return c.Do(func() error { return v.ev.Record(c.stream) })
}

// Wait blocks until the work queued before the last Record has finished.
func (v *Event) Wait() error {
	if v.ev == 0 {
		return nil
	}
	return v.e.Do(v.ev.Synchronize)
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

// Elapsed is the time in milliseconds from start's record to v's (both
// timing events, both complete); 0 on the host.
func (v *Event) Elapsed(start *Event) (float32, error) {
	if v.ev == 0 || start.ev == 0 {
		return 0, nil
	}
	var ms float32
	err := v.e.Do(func() error {
		var err error
		ms, err = cuda.EventElapsed(start.ev, v.ev)
		return err
	})
	return ms, err
}

// Close frees the event.
func (v *Event) Close() error {
	if v.ev == 0 {
		return nil
	}
	err := v.e.Do(v.ev.Destroy)
	v.ev = 0
	return err
}

// WaitEvent makes later work queued on the engine's current stream (the
// main stream, or the side stream inside Side) wait until the work before
// v's last Record has run (cuStreamWaitEvent: the host does not block).
// Recording v inside Side and waiting for it later on the main stream
// joins exactly that piece of side work. On the host it does nothing.
// ErrConfig for a nil event.
func (e *Engine) WaitEvent(v *Event) error {
	if v == nil {
		return fmt.Errorf("%w: wait for a nil event", ErrConfig)
	}
	c := e.cuda
	if c == nil || v.ev == 0 {
		return nil
	}
	return c.Do(func() error { return c.stream.WaitEvent(v.ev) })
}
