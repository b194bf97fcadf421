package service

import (
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
)

// Event is an inter-process CUDA event (exec.IPCEvent) recorded by one
// process's stream and waited for by another's, so that the trainer's
// gradients and the service's updates are ordered on the GPU with no host
// waiting (the pool's Buffer.Ready/Wait do the same through the daemon;
// here the handles are exchanged once, at register, so a step costs no
// extra round trip). On the host backend there is none (a nil *Event,
// whose methods do nothing): the service computes before it replies. The
// client and the server (optimizer/internal/server) both use it.
type Event struct{ v *exec.IPCEvent }

// NewEvent makes an interprocess event on e's device and returns it with
// its handle (nil, nil on the host).
func NewEvent(e *ops.Engine) (*Event, []byte, error) {
	d, ok := e.Device().(device.CUDADevice)
	if !ok || e.Stream() == 0 {
		return nil, nil, nil
	}
	v, err := exec.NewIPCEvent(d)
	if err != nil {
		return nil, nil, fmt.Errorf("optimizer: %w", err)
	}
	h := v.Handle()
	return &Event{v}, h[:], nil
}

// OpenEvent opens the peer's event from its handle (nil on the host or
// without a handle). A handle that is not 64 bytes is ErrProtocol.
func OpenEvent(e *ops.Engine, h []byte) (*Event, error) {
	d, ok := e.Device().(device.CUDADevice)
	if !ok || e.Stream() == 0 || len(h) == 0 {
		return nil, nil
	}
	if len(h) != EventHandleSize {
		return nil, fmt.Errorf("%w: an event handle of %d bytes", ErrProtocol, len(h))
	}
	v, err := exec.OpenIPCEvent(d, [64]byte(h))
	if err != nil {
		return nil, fmt.Errorf("optimizer: the peer's event: %w", err)
	}
	return &Event{v}, nil
}

// Record marks the end of e's queue.
func (x *Event) Record(e *ops.Engine) error {
	if x == nil {
		return nil
	}
	return x.v.Record(e.Stream())
}

// Wait makes e's later work wait for the event's last record.
func (x *Event) Wait(e *ops.Engine) error {
	if x == nil {
		return nil
	}
	return x.v.Wait(e.Stream())
}

// Close destroys an event this side created or opened.
func (x *Event) Close(*ops.Engine) error {
	if x == nil {
		return nil
	}
	return x.v.Close()
}
