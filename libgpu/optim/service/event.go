package service

import (
	"fmt"
	"sync"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/ops"
)

// Event is an interprocess CUDA event (cuIpcGetEventHandle) recorded by
// one process's stream and waited for by another's, so that the trainer's
// gradients and the service's updates are ordered on the GPU with no host
// waiting (the pool's Buffer.Ready/Wait do the same through the daemon;
// here the handles are exchanged once, at register, so a step costs no
// extra round trip). On the host backend it does nothing: the service
// computes before it replies. The client and the server
// (optimizer/internal/server) both use it; a nil *Event does nothing.
type Event struct {
	ev  cuda.Event
	own bool
}

// Events this process created: cuIpcOpenEventHandle cannot open them in
// their own process (a client and a service in one process, in tests).
var ownEvents = struct {
	sync.Mutex
	m map[[64]byte]cuda.Event
}{m: map[[64]byte]cuda.Event{}}

// StreamOf is the CUDA stream e queues on, or 0 on the host (the server
// asks it to know whether a client must send an event).
func StreamOf(e *ops.Engine) cuda.Stream {
	if s, ok := e.Impl().(ops.Streamer); ok {
		return s.Stream()
	}
	return 0
}

// NewEvent makes an interprocess event on e's device and returns it
// with its handle (nil, nil on the host).
func NewEvent(e *ops.Engine) (*Event, []byte, error) {
	if StreamOf(e) == 0 {
		return nil, nil, nil
	}
	v := &Event{own: true}
	var h cuda.IpcEventHandle
	err := e.Do(func() error {
		var err error
		if v.ev, err = cuda.EventCreate(cuda.EventInterprocess | cuda.EventDisableTiming); err != nil {
			return err
		}
		if h, err = cuda.IpcGetEventHandle(v.ev); err != nil {
			v.ev.Destroy()
		}
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("optimizer: interprocess event: %w", err)
	}
	ownEvents.Lock()
	ownEvents.m[h] = v.ev
	ownEvents.Unlock()
	return v, h[:], nil
}

// OpenEvent opens the peer's event from its handle (nil on the host or
// without a handle).
func OpenEvent(e *ops.Engine, h []byte) (*Event, error) {
	if StreamOf(e) == 0 || len(h) == 0 {
		return nil, nil
	}
	if len(h) != 64 {
		return nil, fmt.Errorf("%w: an event handle of %d bytes", ErrProtocol, len(h))
	}
	ownEvents.Lock()
	ev, ok := ownEvents.m[[64]byte(h)]
	ownEvents.Unlock()
	if ok {
		return &Event{ev: ev}, nil
	}
	v := &Event{}
	err := e.Do(func() error {
		var err error
		v.ev, err = cuda.IpcOpenEventHandle(cuda.IpcEventHandle(h))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("optimizer: open the peer's event: %w", err)
	}
	v.own = true // opened here: destroyed here
	return v, nil
}

// Record marks the end of e's queue.
func (v *Event) Record(e *ops.Engine) error {
	if v == nil {
		return nil
	}
	s := StreamOf(e)
	return e.Do(func() error { return v.ev.Record(s) })
}

// Wait makes e's later work wait for the event's last record.
func (v *Event) Wait(e *ops.Engine) error {
	if v == nil {
		return nil
	}
	s := StreamOf(e)
	return e.Do(func() error { return s.WaitEvent(v.ev) })
}

// Close destroys an event this side created or opened.
func (v *Event) Close(e *ops.Engine) error {
	if v == nil || !v.own || v.ev == 0 {
		return nil
	}
	ownEvents.Lock()
	for h, ev := range ownEvents.m {
		if ev == v.ev {
			delete(ownEvents.m, h)
		}
	}
	ownEvents.Unlock()
	err := e.Do(v.ev.Destroy)
	v.ev = 0
	return err
}
