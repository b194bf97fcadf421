package optim

import (
	"errors"
	"fmt"
	"strings"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// ErrConfig: an optimizer's configuration is out of its valid range.
var ErrConfig = errors.New("optim: invalid configuration")

// Capturer is implemented by optimizers that say whether their Step may be
// captured into a CUDA graph and replayed: a step that depends on host
// state changing from step to step (a preconditioner refresh every k
// steps, a learning rate given as a kernel argument) must run eagerly.
type Capturer interface {
	Capturable() bool
}

// CanCapture reports whether o's Step may be replayed from a captured
// graph: o says so (Capturer), or it is one of the stateless-schedule
// optimizers (AdamW, SGD), which may.
func CanCapture(o Optimizer) bool {
	if c, ok := o.(Capturer); ok {
		return c.Capturable()
	}
	return true
}

// Phaser is implemented by optimizers whose steps may be captured and
// replayed at some steps only: a step's device work depends on the host's
// state (a preconditioner refresh's schedule) only through its phase, so
// the steps of one phase may replay one captured Step (the driver keeps a
// graph per phase; trainer/internal/driver.Runner.SetPostPhases).
type Phaser interface {
	// NextPhase is the phase of the next Step: −1 when it must run
	// eagerly (host work is due), else an id ≥ 0.
	NextPhase() int
	// Replayed advances the host's mirror of the optimizer (its step
	// count) past a step replayed from a graph instead of calling Step.
	Replayed()
}

// Stepper is implemented by optimizers that know how many steps they
// have taken (the host's mirror of the device's step counter).
type Stepper interface {
	Steps() int
}

// counter is the host's mirror of a device step counter ("step", [1]
// i32): t is the number of steps taken, −1 when unknown (after
// construction or a checkpoint load, the device holds it: read once at the
// next step, the only time a step waits for the device).
type counter struct {
	t   int
	dev *tensor.Tensor
}

// advance advances the counter and returns the new step number (from 1):
// on the host's mirror, and on the device (ops.Engine.StepCounter, which
// also leaves bc ([2] f32, or nil) = {1−β1ᵗ⁻ˡᵃᵍ, 1−β2ᵗ⁻ˡᵃᵍ} there), so
// that a replayed graph advances the device's counter by itself.
func (c *counter) advance(e *ops.Engine, bc *tensor.Tensor, beta1, beta2 float32, lag int) (int, error) {
	if err := c.load(e); err != nil {
		return 0, err
	}
	c.t++
	return c.t, e.StepCounter(c.dev, bc, beta1, beta2, lag)
}

// load reads the device counter when the host's mirror is unknown.
func (c *counter) load(e *ops.Engine) error {
	if c.t >= 0 {
		return nil
	}
	if err := e.Sync(); err != nil {
		return err
	}
	b, err := c.dev.Read()
	if err != nil {
		return fmt.Errorf("optim: reading the step counter: %w", err)
	}
	c.t = int(tensor.BytesAs[int32](b)[0])
	return nil
}

// work allocates a buffer the optimizer uses within steps but that is not
// state (not in State, not checkpointed): named prefix/optim/work/<n>.
func (s *state) work(a device.Allocator, prefix, n string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	full := name(prefix, "work/"+n)
	t, err := tensor.Alloc(a, full, dt, shape...)
	if err != nil {
		return nil, fmt.Errorf("optim: allocating %s: %w", full, err)
	}
	s.works = append(s.works, t)
	return t, nil
}

// matrix2D views a parameter as a matrix: [1, 1] for a scalar, [1, n] for
// a vector, [shape[0], rest] for rank > 2.
func matrix2D(t *tensor.Tensor) (*tensor.Tensor, error) {
	switch t.Rank() {
	case 0:
		return t.View(1, 1)
	case 1:
		return t.View(1, t.Dim(0))
	case 2:
		return t, nil
	}
	return t.View(t.Dim(0), -1)
}

// matches reports whether name contains one of the substrings.
func matches(name string, subs []string) bool {
	for _, s := range subs {
		if s != "" && strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// identity writes the identity into t: into every matrix of an f32
// [..., d, d], and into every row of an i32 [..., d] of permutations
// (0, 1, …, d−1), such as SOAP's.
func identity(t *tensor.Tensor) error {
	d := t.Dim(-1)
	if t.DType == tensor.I32 {
		p := make([]int32, t.Numel())
		for i := range p {
			p[i] = int32(i % d)
		}
		return t.Write(tensor.AsBytes(p))
	}
	v := make([]float32, t.Numel())
	for i := 0; i < len(v); i += d * d {
		for k := 0; k < d; k++ {
			v[i+k*d+k] = 1
		}
	}
	return t.WriteFloat32(v)
}

// checkParams checks that every parameter has a name of its own (none
// empty, none twice) and an f32 value and gradient of one shape with at
// least one element. Errors wrap ErrParams and name the parameter.
func checkParams(params []nn.Param) error {
	if len(params) == 0 {
		return fmt.Errorf("%w: no parameters", ErrParams)
	}
	seen := make(map[string]bool, len(params))
	for i, p := range params {
		switch {
		case p.Name == "":
			return fmt.Errorf("%w: parameter %d has an empty name", ErrParams, i)
		case seen[p.Name]:
			return fmt.Errorf("%w: parameter name %q given twice", ErrParams, p.Name)
		case p.Value == nil || p.Grad == nil:
			return fmt.Errorf("%w: %q has no value or gradient", ErrParams, p.Name)
		case p.Value.DType != tensor.F32 || p.Grad.DType != tensor.F32 || !tensor.SameShape(p.Value.Shape, p.Grad.Shape):
			return fmt.Errorf("%w: %q is %v %v with gradient %v %v (want f32 of one shape)", ErrParams, p.Name,
				p.Value.DType, p.Value.Shape, p.Grad.DType, p.Grad.Shape)
		case p.Value.Numel() == 0:
			return fmt.Errorf("%w: %q has shape %v: no elements", ErrParams, p.Name, p.Value.Shape)
		}
		seen[p.Name] = true
	}
	return nil
}
