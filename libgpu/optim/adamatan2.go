package optim

import (
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// AdamATan2 is Adam-atan2 (Everett et al. 2024) as the adam-atan2 package
// that sapientinc/HRM trains with computes it: ops.AdamATan2Config gives
// the rule, its a/b constants and how it differs from the paper's form.
type AdamATan2 struct {
	moments
	cfg ops.AdamATan2Config
}

// NewAdamATan2 allocates, for every param, "<name>.exp_avg" and
// "<name>.exp_avg_sq" (the package's state names; f32, the param's
// shape) and one "step" ([1] i32; the package keeps a float step per
// param, all equal), all zero. Errors wrap ErrParams or allocation
// errors; nothing stays allocated on error.
func NewAdamATan2(a device.Allocator, prefix string, params []nn.Param, cfg ops.AdamATan2Config) (*AdamATan2, error) {
	o := &AdamATan2{cfg: cfg}
	if err := o.init(a, prefix, params); err != nil {
		o.s.free()
		return nil, err
	}
	return o, nil
}

// Step implements Optimizer (one ops.Engine.AdamATan2 call: two kernels,
// no host synchronisation; capturable).
func (o *AdamATan2) Step(e *ops.Engine) error {
	return e.AdamATan2(o.s.params, o.s.grads, o.m, o.v, o.step, o.cfg)
}

// SetLR implements Optimizer.
func (o *AdamATan2) SetLR(lr float32) { o.cfg.LR = lr }

// SetLRScale sets the configuration's LRScale (nil: none): a device
// scalar multiplying LR, which a captured step follows.
func (o *AdamATan2) SetLRScale(t *tensor.Tensor) { o.cfg.LRScale = t }

// Config is the current configuration.
func (o *AdamATan2) Config() ops.AdamATan2Config { return o.cfg }

// SignSGD is sign-SGD with decoupled weight decay, the update of HRM's
// puzzle embedding (ops.SignSGDConfig: the dense form, which for Sudoku's
// single puzzle identifier is HRM's sparse one). It has no state.
type SignSGD struct {
	cfg ops.SignSGDConfig
	s   state
}

// NewSignSGD returns sign-SGD over params (no state is allocated). Errors
// wrap ErrParams.
func NewSignSGD(params []nn.Param, cfg ops.SignSGDConfig) (*SignSGD, error) {
	o := &SignSGD{cfg: cfg}
	if err := o.s.init(params); err != nil {
		return nil, err
	}
	return o, nil
}

// Step implements Optimizer (one ops.Engine.SignSGD call; capturable).
func (o *SignSGD) Step(e *ops.Engine) error { return e.SignSGD(o.s.params, o.s.grads, o.cfg) }

// State implements Optimizer: none.
func (o *SignSGD) State() []nn.Param { return nil }

// SetLR implements Optimizer.
func (o *SignSGD) SetLR(lr float32) { o.cfg.LR = lr }

// SetLRScale sets the configuration's LRScale (nil: none).
func (o *SignSGD) SetLRScale(t *tensor.Tensor) { o.cfg.LRScale = t }

// Config is the current configuration.
func (o *SignSGD) Config() ops.SignSGDConfig { return o.cfg }

// Reset implements Optimizer (nothing to reset).
func (o *SignSGD) Reset(*ops.Engine) error { return nil }

// Free implements Optimizer (nothing to free).
func (o *SignSGD) Free() error { return nil }

var (
	_ Optimizer = (*AdamATan2)(nil)
	_ Optimizer = (*SignSGD)(nil)
)
