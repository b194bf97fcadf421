package service

import (
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
)

// ipcEvent is an inter-process CUDA event (exec.IPCEvent) recorded by one
// process's stream and waited for by another's, so that the trainer's
// gradients and the service's updates are ordered on the GPU with no host
// waiting (the pool's Buffer.Ready/Wait do the same through the daemon;
// here the handles are exchanged once, at register, so a step costs no
// extra round trip). On the host backend there is none (a nil *ipcEvent,
// whose methods do nothing): the service computes before it replies.
type ipcEvent struct{ v *exec.IPCEvent }

// newIPCEvent makes an interprocess event on e's device and returns it
// with its handle (nil, nil on the host).
func newIPCEvent(e *ops.Engine) (*ipcEvent, []byte, error) {
	d, ok := e.Device().(device.CUDADevice)
	if !ok || e.Stream() == 0 {
		return nil, nil, nil
	}
	v, err := exec.NewIPCEvent(d)
	if err != nil {
		return nil, nil, fmt.Errorf("optimizer: %w", err)
	}
	h := v.Handle()
	return &ipcEvent{v}, h[:], nil
}

// openIPCEvent opens the peer's event from its handle (nil on the host or
// without a handle).
func openIPCEvent(e *ops.Engine, h []byte) (*ipcEvent, error) {
	d, ok := e.Device().(device.CUDADevice)
	if !ok || e.Stream() == 0 || len(h) == 0 {
		return nil, nil
	}
	if len(h) != 64 {
		return nil, fmt.Errorf("%w: an event handle of %d bytes", ErrProtocol, len(h))
	}
	v, err := exec.OpenIPCEvent(d, [64]byte(h))
	if err != nil {
		return nil, fmt.Errorf("optimizer: the peer's event: %w", err)
	}
	return &ipcEvent{v}, nil
}

// record marks the end of e's queue.
func (x *ipcEvent) record(e *ops.Engine) error {
	if x == nil {
		return nil
	}
	return x.v.Record(e.Stream())
}

// wait makes e's later work wait for the event's last record.
func (x *ipcEvent) wait(e *ops.Engine) error {
	if x == nil {
		return nil
	}
	return x.v.Wait(e.Stream())
}

// close destroys an event this side created or opened.
func (x *ipcEvent) close(*ops.Engine) error {
	if x == nil {
		return nil
	}
	return x.v.Close()
}
