package ops

import (
	"errors"
	"fmt"

	"gonum.org/v1/gonum/blas/gonum"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/tensor"
)

// More errors.
var (
	// ErrConfig: an op's hyper-parameter is out of its valid range.
	ErrConfig = errors.New("ops: invalid configuration")
	// ErrLabel: a class label is outside [0, C). Only the host backend can
	// detect it (a GPU backend does not read labels back).
	ErrLabel = errors.New("ops: label out of range")
)

// Options configure an Engine.
type Options struct {
	// Precision for f32 GEMMs (default PrecF32 on the zero value; tools pick TF32 on GPUs).
	Precision Precision
	// NoLinearChain makes HasLinearChain false, so models take the per-layer
	// backward (LinearBackward) even where the backend fuses the previous
	// layer's activation derivative into the dx GEMM (LinearBackwardChain).
	NoLinearChain bool
	// HighPriorityComm: exec.Options.HighPriorityComm (the communication
	// stream at the context's greatest priority).
	HighPriorityComm bool
}

// Engine runs the op families on one device: the runtime's engine
// (exec.Engine: the backend, the device thread, capture, events, staging,
// side streams, While) with the op families' methods and settings. Not
// safe for concurrent use: on CUDA it owns a stream, and ops are queued on
// it in call order.
type Engine struct {
	*exec.Engine
	opts   Options
	h      *hostImpl // the host backend, or nil
	c      *cudaImpl // the CUDA backend, or nil
	queued int64     // ops that reached a backend (Queued)
}

// hostImpl is the host backend as the op families see it: the runtime's
// (exec.Host) and GEMMs through gonum's row-major BLAS
// (blas/gonum.Implementation.Sgemm). Every precision is computed in f32.
// Engine methods have validated shapes, dtypes and devices; the slices
// come from tensor.F32/I32, which fail for non-host memory.
type hostImpl struct {
	*exec.Host
	blas gonum.Implementation
}

// cudaImpl is the CUDA backend as the op families see it: the runtime's
// (exec.CUDA: the current stream, scratch, kernel launches through the
// typed launchers, cuBLASLt and cuSOLVER) and the engine's GEMM settings.
type cudaImpl struct {
	*exec.CUDA
	prec Precision
	// noFuse turns off every cuBLASLt epilogue: GEMMs store the plain
	// product and NVRTC kernels add bias, activation and bias gradients.
	// Tests compare both paths with the reference.
	noFuse bool
}

// cudaFusion says whether engines made from now on use cuBLASLt's fused
// epilogues (the default) or the unfused path; only tests change it.
var cudaFusion = true

// NewEngine returns an engine for dev (exec.NewEngine: the host backend,
// or the CUDA backend for a device.CUDADevice). Errors: ErrConfig for a
// precision a CUDA engine does not know, exec.ErrNoBackend for a device
// with no backend, or the CUDA driver's.
func NewEngine(dev device.Device, opts Options) (*Engine, error) {
	if dev.Kind() == device.KindCUDA && opts.Precision > PrecBF16 {
		return nil, fmt.Errorf("%w: precision %d", ErrConfig, opts.Precision)
	}
	x, err := exec.NewEngine(dev, exec.Options{HighPriorityComm: opts.HighPriorityComm})
	if err != nil {
		return nil, err
	}
	e := &Engine{Engine: x, opts: opts}
	if h := x.Host(); h != nil {
		e.h = &hostImpl{Host: h}
	}
	if c := x.CUDA(); c != nil {
		e.c = &cudaImpl{CUDA: c, prec: opts.Precision, noFuse: !cudaFusion}
	}
	return e, nil
}

// Queued is the number of ops queued on the engine so far: every call of
// an op family that passed its checks and reached the backend counts one
// (on a GPU one op is one or a few launches, or one library call). What a
// step costs in host launch work is told by its count.
func (e *Engine) Queued() int64 { return e.queued }

// Options is what the engine was made with.
func (e *Engine) Options() Options { return e.opts }

// dispatch runs host on the host backend and gpu on the CUDA backend (on
// the device's thread, its context current). A nil function gives
// exec.ErrNoBackend.
func (e *Engine) dispatch(host func(h *hostImpl) error, gpu func(c *cudaImpl) error) error {
	e.queued++
	switch {
	case e.h != nil && host != nil:
		return host(e.h)
	case e.c != nil && gpu != nil:
		return e.c.Do(func() error { return gpu(e.c) })
	}
	return fmt.Errorf("%w: %v", exec.ErrNoBackend, e.Device())
}

// check verifies that t is present, of dtype dt and shape want, contiguous
// and on the engine's device.
func (e *Engine) check(what string, t *tensor.Tensor, dt tensor.DType, want ...int) error {
	if err := t.CheckShape(what, dt, want...); err != nil {
		return err
	}
	return e.CheckPlace(what, t)
}

func matrix(what string, t *tensor.Tensor) (rows, cols int, err error) {
	if t == nil {
		return 0, 0, fmt.Errorf("%w: %s is missing", tensor.ErrShape, what)
	}
	if len(t.Shape) != 2 || t.Shape[0] <= 0 || t.Shape[1] <= 0 {
		return 0, 0, fmt.Errorf("%w: %s is %v, want a non-empty matrix", tensor.ErrShape, what, t.Shape)
	}
	return t.Shape[0], t.Shape[1], nil
}
