package service

import (
	"errors"
	"fmt"

	"gpukit/libgpu/ipc"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/tensor"
)

// Ops of the optimizer protocol (PROTOCOL.md beside this file).
const (
	OpHello    = "hello"
	OpRegister = "register"
	OpStep     = "step"
	OpReset    = "reset"
	OpStats    = "stats"
	OpClose    = "close"
)

// Limits of a request (PROTOCOL.md, "Limits").
const (
	// MaxNameLen is the longest run or parameter name in bytes (a state
	// buffer is named "<run>/optim/<param>.<state>", which must fit the
	// pool's 255 bytes).
	MaxNameLen = 100
	// MaxDims is the most dimensions of a tensor (the pool's).
	MaxDims = pool.MaxDims
	// MaxTensorBytes is the most bytes one tensor reference may span (the
	// pool's largest buffer, 1 TiB).
	MaxTensorBytes = 1 << 40
	// TensorAlign is the alignment of a tensor's byte offset in its
	// buffer: the pool's (cuBLASLt assumes 256-byte aligned pointers; a
	// misaligned one could fail in a way that ends the service's CUDA
	// context).
	TensorAlign = 256
)

// Errors of the service. They cross the socket with the codes registered
// in init, so errors.Is works on what a Client returns; optim.ErrConfig and
// optim.ErrParams cross as "optim.config" and "optim.params".
var (
	// ErrNotRegistered: step, reset or stats before register.
	ErrNotRegistered = errors.New("optimizer: no run registered on this connection")
	// ErrRegistered: a second register on one connection.
	ErrRegistered = errors.New("optimizer: a run is already registered on this connection")
	// ErrTensor: a tensor reference names no buffer, or does not fit it.
	ErrTensor = errors.New("optimizer: bad tensor reference")
	// ErrGone: the service's connection ended (it exited or was killed).
	ErrGone = errors.New("optimizer: service gone")
	// ErrProtocol: the peer is not an optimizer service, or broke the protocol.
	ErrProtocol = errors.New("optimizer: protocol error")
	// ErrRunInUse: register of a run name that a live connection of the
	// same uid holds.
	ErrRunInUse = errors.New("optimizer: run name in use")
)

func init() {
	ipc.RegisterError("optimizer.not_registered", ErrNotRegistered)
	ipc.RegisterError("optimizer.registered", ErrRegistered)
	ipc.RegisterError("optimizer.bad_tensor", ErrTensor)
	ipc.RegisterError("optimizer.run_in_use", ErrRunInUse)
	ipc.RegisterError("optim.config", optim.ErrConfig)
	ipc.RegisterError("optim.params", optim.ErrParams)
}

// HelloRequest opens a session; Client names the program (for logs).
type HelloRequest struct {
	Client string `msgpack:"client,omitempty"`
}

// HelloReply describes the service.
type HelloReply struct {
	Server  string `msgpack:"server"`  // "optimizer"
	PID     int    `msgpack:"pid"`     // the service's process id
	Backend string `msgpack:"backend"` // "host" or "cuda"
	// Pool is the gpupool socket the service works with (absolute, or
	// "@name"): register hands over a connection to it.
	Pool string `msgpack:"pool"`
	UID  uint32 `msgpack:"uid"` // the client, as SO_PEERCRED saw it
}

// TensorRef names a tensor inside a named buffer of the pool: Offset in
// elements of DType from the buffer's start, contiguous, of Shape.
type TensorRef struct {
	Buffer string  `msgpack:"buffer"`
	Offset int64   `msgpack:"offset,omitempty"`
	DType  string  `msgpack:"dtype"`
	Shape  []int64 `msgpack:"shape"`
}

// ParamRef is a parameter: its name (the optimizer's state is named after
// it), its value and its gradient.
type ParamRef struct {
	Name  string    `msgpack:"name"`
	Value TensorRef `msgpack:"value"`
	Grad  TensorRef `msgpack:"grad"`
}

// LayerRef is one of K-FAC's linear layers (optim.KFACLayer): parameter
// names, and the layer's input and output gradient buffers.
type LayerRef struct {
	Weight  string     `msgpack:"weight"`
	Bias    string     `msgpack:"bias,omitempty"`
	Input   *TensorRef `msgpack:"input,omitempty"`
	OutGrad *TensorRef `msgpack:"out_grad,omitempty"`
}

// EventHandleSize is the length in bytes of a register's event: a
// CUDA interprocess event handle (CUipcEventHandle, 64 bytes).
const EventHandleSize = 64

// RegisterRequest builds a run's optimizer over the client's buffers.
// Event (cuda) is the client's interprocess event (a 64-byte
// CUipcEventHandle) that it records after its gradients are written, every
// step, before sending step.
//
// LRScale, when set, names an f32 scalar the client rewrites each step (a
// learning-rate schedule): optimizers that take a device scale (AdamW,
// Muon) multiply their learning rate by it when the step runs, exactly as
// in the client's process; the reply says whether the optimizer took it.
type RegisterRequest struct {
	Run     string     `msgpack:"run"`
	Spec    optim.Spec `msgpack:"spec"`
	Params  []ParamRef `msgpack:"params"`
	Layers  []LayerRef `msgpack:"layers,omitempty"`
	Event   []byte     `msgpack:"event,omitempty"`
	LRScale *TensorRef `msgpack:"lr_scale,omitempty"`
}

// StateRef is one tensor of the optimizer's state (optim.Optimizer.State):
// its state name and where it lives in the pool.
type StateRef struct {
	Name   string    `msgpack:"name"`
	Tensor TensorRef `msgpack:"tensor"`
}

// RegisterReply lists the state and, on cuda, the service's interprocess
// event, which it records after each step's updates.
type RegisterReply struct {
	State   []StateRef `msgpack:"state"`
	Event   []byte     `msgpack:"event,omitempty"`
	LRScale bool       `msgpack:"lr_scale,omitempty"` // the optimizer reads the request's LRScale
}

// StepRequest asks for one step. LR, when positive, is the learning rate
// from this step on (a schedule).
type StepRequest struct {
	LR float32 `msgpack:"lr,omitempty"`
}

// StepReply is sent once the step is queued (not finished: the client's
// stream waits for the service's event).
type StepReply struct {
	Step int `msgpack:"step"` // steps taken (−1: unknown until the first step after a resume)
}

// StatsReply reports the connection's run (when one is registered) and
// the service's limits.
type StatsReply struct {
	Run       string `msgpack:"run,omitempty"` // the run's name ("" before register)
	Steps     int    `msgpack:"steps"`         // −1: unknown (no run, or before the first step after a resume)
	Refreshes int    `msgpack:"refreshes"`
	Failures  int    `msgpack:"failures"`
	F64       int    `msgpack:"f64"`
	// RunBytes is what the run's state and work buffers take in the pool,
	// in bytes; MaxRunBytes bounds it (0: only the pool's --limit and the
	// uid's --quota-uid do).
	RunBytes    int64 `msgpack:"run_bytes"`
	MaxRunBytes int64 `msgpack:"max_run_bytes"`
	// The service: runs registered, connections open and their limit
	// (each connection holds at most one run and one frame buffer of
	// MaxMessage bytes), the open file limit.
	Runs       int    `msgpack:"runs"`
	Conns      int    `msgpack:"conns"`
	MaxConns   int    `msgpack:"max_conns"`
	FDLimit    uint64 `msgpack:"fd_limit"`
	MaxMessage int    `msgpack:"max_message"`
	// MaxOrder is the largest preconditioner matrix order (max_block,
	// K-FAC's factor sides).
	MaxOrder int `msgpack:"max_order"`
}

// Ref describes t, a view into a buffer named buffer.
func Ref(buffer string, t *tensor.Tensor) TensorRef {
	shape := make([]int64, len(t.Shape))
	for i, d := range t.Shape {
		shape[i] = int64(d)
	}
	return TensorRef{Buffer: buffer, Offset: int64(t.Offset), DType: t.DType.String(), Shape: shape}
}

// Check checks r as span does and returns its shape as ints, its byte
// offset and its byte count (where names r in the request or reply, for
// errors). Both sides of the protocol check every reference with it.
func (r TensorRef) Check(where string) (shape []int, off, n int64, err error) {
	if off, n, err = r.span(where); err != nil {
		return nil, 0, 0, err
	}
	shape = make([]int, len(r.Shape))
	for i, d := range r.Shape {
		shape[i] = int(d)
	}
	return shape, off, n, nil
}

// span checks r's dtype, shape and offset and returns the byte offset and
// byte count it covers, with every product checked against MaxTensorBytes
// before it is formed (so a shape of [2^32, 2^32] or an offset of 2^62
// cannot wrap around). Errors wrap ErrTensor and name where (path).
func (r TensorRef) span(path string) (off, n int64, err error) {
	dt, derr := tensor.ParseDType(r.DType)
	if derr != nil {
		return 0, 0, fmt.Errorf("%w: %s.dtype: %v", ErrTensor, path, derr)
	}
	if len(r.Shape) > MaxDims {
		return 0, 0, fmt.Errorf("%w: %s.shape: %d dimensions (at most %d)", ErrTensor, path, len(r.Shape), MaxDims)
	}
	size := int64(dt.Size())
	elems := int64(1)
	for i, d := range r.Shape {
		if d < 0 || d > MaxTensorBytes {
			return 0, 0, fmt.Errorf("%w: %s.shape[%d]: %d is out of range (0 to %d)", ErrTensor, path, i, d, int64(MaxTensorBytes))
		}
		if d != 0 && elems > MaxTensorBytes/size/d {
			return 0, 0, fmt.Errorf("%w: %s.shape %v: more than %d bytes of %s", ErrTensor, path, r.Shape, int64(MaxTensorBytes), dt)
		}
		elems *= d
	}
	if r.Offset < 0 || r.Offset > MaxTensorBytes/size {
		return 0, 0, fmt.Errorf("%w: %s.offset: %d elements is out of range", ErrTensor, path, r.Offset)
	}
	off, n = r.Offset*size, elems*size
	if off%TensorAlign != 0 {
		return 0, 0, fmt.Errorf("%w: %s.offset: element %d of %s is byte %d, not a multiple of %d", ErrTensor, path, r.Offset, dt, off, TensorAlign)
	}
	return off, n, nil
}
