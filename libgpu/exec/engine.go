package exec

import (
	"errors"
	"fmt"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// Errors.
var (
	// ErrNoBackend: no backend for the device (or for the op on it).
	ErrNoBackend = errors.New("exec: no backend for this device")
	// ErrDevice: a tensor is not on the engine's device.
	ErrDevice = errors.New("exec: tensors on different devices")
	// ErrConfig: an argument of a runtime call is out of its range (a
	// While limit without a count, a wait for a nil event).
	ErrConfig = errors.New("exec: invalid configuration")
)

// Options configure an Engine.
type Options struct {
	// HighPriorityComm makes the communication stream (CommSide) a stream
	// of the context's greatest priority (cuStreamCreateWithPriority), so
	// that as SMs free up the block scheduler starts the collectives'
	// blocks (NCCL's CTAs, one per channel) before the backward's pending
	// GEMM blocks, and a bucket's all-reduce is not held up behind the
	// backward it overlaps — ProcessGroupNCCL's is_high_priority_stream
	// option in PyTorch. Off: the default priority, as every other stream.
	// No effect on the host.
	HighPriorityComm bool
}

// Engine runs work on one device through its backend: Host for
// device.KindHost, CUDA for device.KindCUDA. Not safe for concurrent use:
// on CUDA it owns a stream, and work is queued on it in call order.
type Engine struct {
	dev  device.Device
	opts Options
	host *Host
	cuda *CUDA
}

// NewEngine returns an engine for dev: the host backend for a host
// device, the CUDA backend (a stream, a cuBLASLt handle and its 32 MiB
// workspace) for a device.CUDADevice. Errors: ErrNoBackend for other
// devices, or the CUDA driver's.
func NewEngine(dev device.Device, opts Options) (*Engine, error) {
	e := &Engine{dev: dev, opts: opts}
	switch dev.Kind() {
	case device.KindHost:
		e.host = &Host{}
		return e, nil
	case device.KindCUDA:
		cd, ok := dev.(device.CUDADevice)
		if !ok {
			return nil, fmt.Errorf("%w: %v does not expose a CUDA context", ErrNoBackend, dev)
		}
		c, err := newCUDA(cd, opts)
		if err != nil {
			return nil, err
		}
		e.cuda = c
		return e, nil
	}
	return nil, fmt.Errorf("%w: %v", ErrNoBackend, dev)
}

// Device is the engine's device.
func (e *Engine) Device() device.Device { return e.dev }

// Host is the host backend, nil on a GPU.
func (e *Engine) Host() *Host { return e.host }

// CUDA is the CUDA backend, nil on the host.
func (e *Engine) CUDA() *CUDA { return e.cuda }

// Dispatch runs host on the host backend, or gpu on the CUDA backend on the
// device's thread (its context current). A nil function, or another
// backend, gives ErrNoBackend.
func (e *Engine) Dispatch(host func(*Host) error, gpu func(*CUDA) error) error {
	switch {
	case e.host != nil && host != nil:
		return host(e.host)
	case e.cuda != nil && gpu != nil:
		return e.cuda.Do(func() error { return gpu(e.cuda) })
	}
	return fmt.Errorf("%w: %v", ErrNoBackend, e.dev)
}

// Do runs f on the device's thread with its context current (CUDA; the
// host just calls f). Wrap a sequence of ops in one Do to keep them on one
// OS thread (stream capture needs that).
func (e *Engine) Do(f func() error) error {
	if e.cuda != nil {
		return e.cuda.Do(f)
	}
	return f()
}

// Sync waits until everything queued on the engine has finished.
func (e *Engine) Sync() error {
	if c := e.cuda; c != nil {
		return c.Do(func() error { return c.stream.Synchronize() })
	}
	return nil
}

// Stream is the CUDA stream the engine queues its work on (inside Side or
// CommSide, that stream), for code that orders its own CUDA work with the
// engine's (NCCL collectives, the pool's and the optimizer service's
// inter-process events, GPU timers); 0 on the host.
func (e *Engine) Stream() cuda.Stream {
	if e.cuda != nil {
		return e.cuda.stream
	}
	return 0
}

// Close waits for the engine's work and frees its backend's resources: on
// CUDA the streams, workspaces, scratch buffers, library handles and the
// op families' state (StateOf). Graphs captured on the engine must not be
// launched afterwards. A second Close, and Close on the host, do nothing.
func (e *Engine) Close() error {
	if e.cuda != nil {
		return e.cuda.close()
	}
	return nil
}

// IsGraphCapable reports whether Capture records a device graph (CUDA)
// rather than a function replayed eagerly (host).
func (e *Engine) IsGraphCapable() bool { return e.cuda != nil }

// SameDevice reports whether a and b name the same device. Zero-size device
// values need not compare equal as pointers, so kind and name decide.
func SameDevice(a, b device.Device) bool {
	return a == b || (a.Kind() == b.Kind() && a.String() == b.String())
}

// CheckPlace verifies that t is present, contiguous, on the engine's
// device and inside its buffer. Errors wrap tensor.ErrShape,
// tensor.ErrLayout or ErrDevice and name the tensor as what.
func (e *Engine) CheckPlace(what string, t *tensor.Tensor) error {
	if t == nil || t.Buf == nil {
		return fmt.Errorf("%w: %s has no buffer", tensor.ErrShape, what)
	}
	if !t.Contiguous() {
		return fmt.Errorf("%w: %s %v strides %v", tensor.ErrLayout, what, t.Shape, t.Strides)
	}
	if !SameDevice(t.Device(), e.dev) {
		return fmt.Errorf("%w: %s is on %v, engine on %v", ErrDevice, what, t.Device(), e.dev)
	}
	if t.ByteOffset()+t.Bytes() > t.Buf.Size() {
		return fmt.Errorf("%w: %s view runs past its buffer", tensor.ErrShape, what)
	}
	return nil
}

// CheckScalar verifies that t is a one-element tensor of dtype dt placed
// as CheckPlace requires. Errors as CheckPlace, and tensor.ErrDType.
func (e *Engine) CheckScalar(what string, t *tensor.Tensor, dt tensor.DType) error {
	if t == nil {
		return fmt.Errorf("%w: %s is missing", tensor.ErrShape, what)
	}
	if t.DType != dt {
		return fmt.Errorf("%w: %s is %v, want %v", tensor.ErrDType, what, t.DType, dt)
	}
	if err := e.CheckPlace(what, t); err != nil {
		return err
	}
	if t.Numel() != 1 {
		return fmt.Errorf("%w: %s is %v, want one element", tensor.ErrShape, what, t.Shape)
	}
	return nil
}
