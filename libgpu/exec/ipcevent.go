package exec

import (
	"fmt"
	"sync"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
)

// IPCEvent is an inter-process CUDA event: made with
// CU_EVENT_INTERPROCESS|CU_EVENT_DISABLE_TIMING (cuEventCreate), named by
// a 64-byte handle (cuIpcGetEventHandle) that another process opens
// (cuIpcOpenEventHandle), recorded by one process's stream and waited for
// by another's, so work in two processes is ordered on the GPU with no
// host waiting in between (CUDA Driver API, "Interprocess Communication").
// The pool's Buffer.Ready and Wait and the optimizer service's
// handshake use it.
//
// cuIpcOpenEventHandle cannot open an event in the process that made it,
// so OpenIPCEvent of a handle this process made returns that event itself
// (a client and a server in one process, in tests).
type IPCEvent struct {
	d   device.CUDADevice
	ev  cuda.Event
	h   [64]byte
	own bool // made or opened here: Close destroys it
}

// ipcOwn holds the events this process made, by handle.
var ipcOwn = struct {
	sync.Mutex
	m map[[64]byte]cuda.Event
}{m: map[[64]byte]cuda.Event{}}

// NewIPCEvent makes an inter-process event on d.
func NewIPCEvent(d device.CUDADevice) (*IPCEvent, error) {
	v := &IPCEvent{d: d, own: true}
	err := d.Do(func() error {
		var err error
		if v.ev, err = cuda.EventCreate(cuda.EventInterprocess | cuda.EventDisableTiming); err != nil {
			return err
		}
		h, err := cuda.IpcGetEventHandle(v.ev)
		if err != nil {
			v.ev.Destroy()
			return err
		}
		v.h = h
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("exec: interprocess event: %w", err)
	}
	ipcOwn.Lock()
	ipcOwn.m[v.h] = v.ev
	ipcOwn.Unlock()
	return v, nil
}

// OpenIPCEvent opens the event with handle h, made by another process (or,
// as the event itself, by this one: see IPCEvent).
func OpenIPCEvent(d device.CUDADevice, h [64]byte) (*IPCEvent, error) {
	ipcOwn.Lock()
	ev, ok := ipcOwn.m[h]
	ipcOwn.Unlock()
	if ok {
		return &IPCEvent{d: d, ev: ev, h: h}, nil
	}
	v := &IPCEvent{d: d, h: h, own: true}
	err := d.Do(func() error {
		var err error
		v.ev, err = cuda.IpcOpenEventHandle(cuda.IpcEventHandle(h))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("exec: open an interprocess event: %w", err)
	}
	return v, nil
}

// Handle is the event's handle, for another process's OpenIPCEvent.
func (v *IPCEvent) Handle() [64]byte { return v.h }

// Owned reports whether Close destroys the event: false when OpenIPCEvent
// returned an event this process made (its maker closes it).
func (v *IPCEvent) Owned() bool { return v.own }

// Record marks the work queued so far on stream s: a Wait on the event
// waits for it.
func (v *IPCEvent) Record(s cuda.Stream) error {
	return v.d.Do(func() error { return v.ev.Record(s) })
}

// Wait makes work queued later on stream s wait for the work before the
// event's last Record (cuStreamWaitEvent: the host does not block).
func (v *IPCEvent) Wait(s cuda.Stream) error {
	return v.d.Do(func() error { return s.WaitEvent(v.ev) })
}

// Close destroys the event when this side made or opened it (Owned); an
// event this process made is also forgotten by OpenIPCEvent. A second
// Close does nothing.
func (v *IPCEvent) Close() error {
	if v == nil || !v.own || v.ev == 0 {
		return nil
	}
	ipcOwn.Lock()
	for h, ev := range ipcOwn.m {
		if ev == v.ev {
			delete(ipcOwn.m, h)
		}
	}
	ipcOwn.Unlock()
	err := v.d.Do(v.ev.Destroy)
	v.ev = 0
	return err
}
