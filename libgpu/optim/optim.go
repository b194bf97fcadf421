package optim

import (
	"errors"
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// ErrParams: the parameter list is unusable (empty, missing gradient).
var ErrParams = errors.New("optim: invalid parameters")

// Optimizer updates parameters in place from their gradients.
type Optimizer interface {
	// Step applies one update from every Param.Grad.
	Step(e *ops.Engine) error
	// State lists the state buffers for checkpoints (Grad is nil).
	State() []nn.Param
	// SetLR changes the learning rate for later steps (schedules).
	SetLR(lr float32)
	// Reset zeroes the state (moments, momentum, step) with ops Fill, as
	// if no step had been taken.
	Reset(e *ops.Engine) error
	// Free releases the state buffers.
	Free() error
}

type state struct {
	params, grads []*tensor.Tensor
	state         []nn.Param
	works         []*tensor.Tensor // buffers that are not state (common.go)
}

func name(prefix, n string) string {
	if prefix == "" {
		return "optim/" + n
	}
	return prefix + "/optim/" + n
}

func (s *state) init(params []nn.Param) error {
	if err := checkParams(params); err != nil {
		return err
	}
	for _, p := range params {
		s.params = append(s.params, p.Value)
		s.grads = append(s.grads, p.Grad)
	}
	return nil
}

// zeros allocates a zero-filled state tensor named prefix+"/optim/"+n. It
// zeroes by copying from host memory (tensor.Write works on every device and
// needs no engine; the constructors run before any engine stream exists).
func (s *state) zeros(a device.Allocator, prefix, n string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	full := name(prefix, n)
	t, err := tensor.Alloc(a, full, dt, shape...)
	if err != nil {
		return nil, fmt.Errorf("optim: allocating %s: %w", full, err)
	}
	s.state = append(s.state, nn.Param{Name: n, Value: t})
	if err := t.Write(make([]byte, t.Bytes())); err != nil {
		return nil, fmt.Errorf("optim: zeroing %s: %w", full, err)
	}
	return t, nil
}

// reset zeroes every state buffer with ops Fill on e.
func (s *state) reset(e *ops.Engine) error {
	for _, p := range s.state {
		if err := e.Fill(p.Value, 0); err != nil {
			return fmt.Errorf("optim: resetting %s: %w", p.Name, err)
		}
	}
	return nil
}

func (s *state) free() error {
	var errs []error
	for _, p := range s.state {
		if err := p.Value.Buf.Free(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range s.works {
		if err := t.Buf.Free(); err != nil {
			errs = append(errs, err)
		}
	}
	s.state, s.works = nil, nil
	return errors.Join(errs...)
}

// moments is the state of the Adam family (AdamW, AdamATan2): for every
// param "<name>.exp_avg" and "<name>.exp_avg_sq" (f32, the param's shape)
// and one "step" ([1] i32), all zero at first; the state names are
// torch.optim.AdamW's and the adam-atan2 package's.
type moments struct {
	s    state
	m, v []*tensor.Tensor
	step *tensor.Tensor
}

// init allocates the moments and the step counter under prefix. On error
// whatever it allocated stays in s for the caller's free.
func (o *moments) init(a device.Allocator, prefix string, params []nn.Param) error {
	if err := o.s.init(params); err != nil {
		return err
	}
	for _, p := range params {
		m, err := o.s.zeros(a, prefix, p.Name+".exp_avg", tensor.F32, p.Value.Shape...)
		if err != nil {
			return err
		}
		v, err := o.s.zeros(a, prefix, p.Name+".exp_avg_sq", tensor.F32, p.Value.Shape...)
		if err != nil {
			return err
		}
		o.m, o.v = append(o.m, m), append(o.v, v)
	}
	var err error
	o.step, err = o.s.zeros(a, prefix, "step", tensor.I32, 1)
	return err
}

// Counter is the device's i32 step counter ([1]): the number of steps
// taken, incremented on the device by every Step (dropout keys its masks
// on it, so a replayed graph draws new ones).
func (o *moments) Counter() *tensor.Tensor { return o.step }

// State implements Optimizer: exp_avg and exp_avg_sq per param in param
// order, then "step".
func (o *moments) State() []nn.Param { return o.s.state }

// Reset implements Optimizer.
func (o *moments) Reset(e *ops.Engine) error { return o.s.reset(e) }

// Free implements Optimizer.
func (o *moments) Free() error { return o.s.free() }

// AdamW is torch.optim.AdamW (see ops.AdamWConfig for the rule and source).
type AdamW struct {
	moments
	cfg ops.AdamWConfig
}

// NewAdamW allocates, for every param, "<name>.exp_avg" and
// "<name>.exp_avg_sq" (same shape, f32) and one "step" ([1] i32), all zero.
// Errors wrap ErrParams or allocation/engine errors; nothing stays
// allocated on error.
func NewAdamW(a device.Allocator, prefix string, params []nn.Param, cfg ops.AdamWConfig) (*AdamW, error) {
	o := &AdamW{cfg: cfg}
	if err := o.init(a, prefix, params); err != nil {
		o.s.free()
		return nil, err
	}
	return o, nil
}

// Step implements Optimizer (one ops.Engine.AdamW call).
func (o *AdamW) Step(e *ops.Engine) error {
	return e.AdamW(o.s.params, o.s.grads, o.m, o.v, o.step, o.cfg)
}

// SetLR implements Optimizer.
func (o *AdamW) SetLR(lr float32) { o.cfg.LR = lr }

// Config is the current configuration.
func (o *AdamW) Config() ops.AdamWConfig { return o.cfg }

// SetLRScale sets the configuration's LRScale (nil: none) for later steps.
func (o *AdamW) SetLRScale(t *tensor.Tensor) { o.cfg.LRScale = t }

// SGD is torch.optim.SGD with momentum (see ops.SGDConfig).
type SGD struct {
	cfg ops.SGDConfig
	s   state
	mom []*tensor.Tensor
}

// NewSGD allocates "<name>.momentum_buffer" per param (zero, even when
// Momentum is 0, so SetLR-only schedules keep the same buffers). Errors as
// NewAdamW.
func NewSGD(a device.Allocator, prefix string, params []nn.Param, cfg ops.SGDConfig) (o *SGD, err error) {
	o = &SGD{cfg: cfg}
	defer func() {
		if err != nil {
			o.s.free()
			o = nil
		}
	}()
	if err := o.s.init(params); err != nil {
		return o, err
	}
	for _, p := range params {
		b, err := o.s.zeros(a, prefix, p.Name+".momentum_buffer", tensor.F32, p.Value.Shape...)
		if err != nil {
			return o, err
		}
		o.mom = append(o.mom, b)
	}
	return o, nil
}

// Step implements Optimizer (one ops.Engine.SGD call).
func (o *SGD) Step(e *ops.Engine) error { return e.SGD(o.s.params, o.s.grads, o.mom, o.cfg) }

// State implements Optimizer: momentum_buffer per param in param order.
func (o *SGD) State() []nn.Param { return o.s.state }

// SetLR implements Optimizer.
func (o *SGD) SetLR(lr float32) { o.cfg.LR = lr }

// Config is the current configuration.
func (o *SGD) Config() ops.SGDConfig { return o.cfg }

// Reset implements Optimizer.
func (o *SGD) Reset(e *ops.Engine) error { return o.s.reset(e) }

// Free implements Optimizer.
func (o *SGD) Free() error { return o.s.free() }

var (
	_ Optimizer = (*AdamW)(nil)
	_ Optimizer = (*SGD)(nil)
)

// BufferName is the allocator name of the state buffer n of an optimizer
// made with prefix (prefix+"/optim/"+n, or "optim/"+n): where a pool
// holds it.
func BufferName(prefix, n string) string { return name(prefix, n) }
