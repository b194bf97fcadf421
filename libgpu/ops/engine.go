package ops

import (
	"errors"
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// More errors.
var (
	// ErrConfig: an optimizer hyper-parameter is out of its valid range.
	ErrConfig = errors.New("ops: invalid configuration")
	// ErrLabel: a class label is outside [0, C). Only the host backend can
	// detect it (a GPU backend does not read labels back).
	ErrLabel = errors.New("ops: label out of range")
)

// sameDevice reports whether a and b name the same device. Zero-size device
// values need not compare equal as pointers, so kind and name decide.
func sameDevice(a, b device.Device) bool {
	return a == b || (a.Kind() == b.Kind() && a.String() == b.String())
}

// check verifies that t is present, of dtype dt and shape want, contiguous
// and on the engine's device.
func (e *Engine) check(what string, t *tensor.Tensor, dt tensor.DType, want ...int) error {
	if err := t.CheckShape(what, dt, want...); err != nil {
		return err
	}
	return e.checkPlace(what, t)
}

func (e *Engine) checkPlace(what string, t *tensor.Tensor) error {
	if t.Buf == nil {
		return fmt.Errorf("%w: %s has no buffer", tensor.ErrShape, what)
	}
	if !t.Contiguous() {
		return fmt.Errorf("%w: %s %v strides %v", tensor.ErrLayout, what, t.Shape, t.Strides)
	}
	if !sameDevice(t.Device(), e.dev) {
		return fmt.Errorf("%w: %s is on %v, engine on %v", ErrDevice, what, t.Device(), e.dev)
	}
	if t.ByteOffset()+t.Bytes() > t.Buf.Size() {
		return fmt.Errorf("%w: %s view runs past its buffer", tensor.ErrShape, what)
	}
	return nil
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

func checkAct(act Act) error {
	if act > ActGELU {
		return fmt.Errorf("%w: unknown activation %v", ErrConfig, act)
	}
	return nil
}

// Linear computes y[M,N] = act(x[M,K]·w[N,K]ᵀ + b[N]), all f32 and contiguous
// on the engine's device (row-major, PyTorch's nn.Linear layout). b may be
// nil. aux, when non-nil ([M,N] f32), receives the pre-activation z; it is
// required for act = ActGELU when LinearBackward will follow. With
// act = ActReLU, aux may instead be a u8 tensor [M, ReLUMaskCols(N)] that
// receives the ReLU bit-mask [z > 0] for LinearBackwardChain (backends with
// HasLinearChain only, else ErrNoBackend). Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout or ErrDevice.
func (e *Engine) Linear(y, x, w, b, aux *tensor.Tensor, act Act) error {
	if err := checkAct(act); err != nil {
		return err
	}
	m, k, err := matrix("linear x", x)
	if err != nil {
		return err
	}
	n, _, err := matrix("linear w", w)
	if err != nil {
		return err
	}
	if err := e.check("linear x", x, tensor.F32, m, k); err != nil {
		return err
	}
	if err := e.check("linear w", w, tensor.F32, n, k); err != nil {
		return err
	}
	if b != nil {
		if err := e.check("linear b", b, tensor.F32, n); err != nil {
			return err
		}
	}
	if err := e.check("linear y", y, tensor.F32, m, n); err != nil {
		return err
	}
	switch {
	case aux != nil && aux.DType == tensor.U8:
		if act != ActReLU {
			return fmt.Errorf("%w: linear u8 aux (a ReLU bit-mask) with activation %v", tensor.ErrDType, act)
		}
		if err := e.check("linear aux (ReLU mask)", aux, tensor.U8, m, ReLUMaskCols(n)); err != nil {
			return err
		}
		if !e.HasLinearChain() {
			return fmt.Errorf("%w: %v has no ReLU bit-masks", ErrNoBackend, e.dev)
		}
	case aux != nil:
		if err := e.check("linear aux", aux, tensor.F32, m, n); err != nil {
			return err
		}
	}
	return e.impl.Linear(y, x, w, b, aux, act)
}

// LinearBackward computes, from dy[M,N], dz = dy ⊙ act'(z) and then
// dx[M,K] = dz·w, dw[N,K] = dzᵀ·x, db[N] = Σ_rows dz (overwriting, not
// accumulating). aux is the pre-activation z for ActGELU, the output y for
// ActReLU (act'(z) = [y > 0]) and may be nil for ActNone. dx and db may be nil.
// GELU's derivative is that of the tanh approximation. Errors as Linear.
func (e *Engine) LinearBackward(dx, dw, db, dy, x, w, aux *tensor.Tensor, act Act) error {
	if err := checkAct(act); err != nil {
		return err
	}
	m, k, err := matrix("linear backward x", x)
	if err != nil {
		return err
	}
	n, _, err := matrix("linear backward w", w)
	if err != nil {
		return err
	}
	checks := []struct {
		what string
		t    *tensor.Tensor
		opt  bool
		sh   []int
	}{
		{"linear backward x", x, false, []int{m, k}},
		{"linear backward w", w, false, []int{n, k}},
		{"linear backward dy", dy, false, []int{m, n}},
		{"linear backward dw", dw, false, []int{n, k}},
		{"linear backward dx", dx, true, []int{m, k}},
		{"linear backward db", db, true, []int{n}},
		{"linear backward aux", aux, act == ActNone, []int{m, n}},
	}
	for _, c := range checks {
		if c.t == nil && c.opt {
			continue
		}
		if err := e.check(c.what, c.t, tensor.F32, c.sh...); err != nil {
			return err
		}
	}
	if act == ActNone {
		aux = nil
	}
	return e.impl.LinearBackward(dx, dw, db, dy, x, w, aux, act)
}

// SoftmaxCrossEntropy computes, for logits[M,C] f32 and labels[M] i32 in
// [0, C), loss[1] = mean_i(−log softmax(logits_i)[labels_i]) and
// dlogits[M,C] = (softmax(logits) − onehot(labels))/M, the gradient of the
// loss (PyTorch's cross_entropy with reduction="mean"). Numerically stable
// (the row maximum is subtracted). The host backend returns ErrLabel for a
// label outside [0, C). Other errors as Linear.
func (e *Engine) SoftmaxCrossEntropy(loss, dlogits, logits, labels *tensor.Tensor) error {
	m, c, err := matrix("cross-entropy logits", logits)
	if err != nil {
		return err
	}
	if err := e.check("cross-entropy logits", logits, tensor.F32, m, c); err != nil {
		return err
	}
	if err := e.check("cross-entropy dlogits", dlogits, tensor.F32, m, c); err != nil {
		return err
	}
	if err := e.check("cross-entropy labels", labels, tensor.I32, m); err != nil {
		return err
	}
	if err := e.check("cross-entropy loss", loss, tensor.F32, 1); err != nil {
		return err
	}
	return e.impl.SoftmaxCrossEntropy(loss, dlogits, logits, labels)
}

func (e *Engine) checkGroups(op string, names []string, groups ...[]*tensor.Tensor) error {
	n := len(groups[0])
	for g := range groups {
		if len(groups[g]) != n {
			return fmt.Errorf("%w: %s: %d %s for %d params", tensor.ErrShape, op, len(groups[g]), names[g], n)
		}
	}
	for i, p := range groups[0] {
		if p == nil {
			return fmt.Errorf("%w: %s: param %d is missing", tensor.ErrShape, op, i)
		}
		for g := range groups {
			what := fmt.Sprintf("%s %s[%d]", op, names[g], i)
			if err := e.check(what, groups[g][i], tensor.F32, p.Shape...); err != nil {
				return err
			}
		}
	}
	return nil
}

// AdamW applies one AdamW step (Loshchilov & Hutter 2019, with PyTorch's
// torch.optim.AdamW semantics, see AdamWConfig) to every params[i] in place
// from grads[i], with first and second moments m[i], v[i] (same shapes, f32,
// zero before the first step). step is an i32 tensor of one element holding
// the number of steps taken; the op increments it and uses the new value t
// for the bias corrections 1−β1ᵗ, 1−β2ᵗ. Requires 0 ≤ β1, β2 < 1, eps > 0
// (else ErrConfig). Errors as Linear.
func (e *Engine) AdamW(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamWConfig) error {
	if !(cfg.Beta1 >= 0 && cfg.Beta1 < 1 && cfg.Beta2 >= 0 && cfg.Beta2 < 1 && cfg.Eps > 0 && cfg.LR >= 0 && cfg.WeightDecay >= 0) {
		return fmt.Errorf("%w: AdamW %+v", ErrConfig, cfg)
	}
	if err := e.checkGroups("adamw", []string{"params", "grads", "m", "v"}, params, grads, m, v); err != nil {
		return err
	}
	if cfg.NoDecay != nil && len(cfg.NoDecay) != len(params) {
		return fmt.Errorf("%w: adamw NoDecay has %d entries for %d params", ErrConfig, len(cfg.NoDecay), len(params))
	}
	if cfg.LRScale != nil {
		if err := e.check("adamw LRScale", cfg.LRScale, tensor.F32, 1); err != nil {
			return err
		}
	}
	if cfg.GradScale != nil {
		if err := e.check("adamw GradScale", cfg.GradScale, tensor.F32, 1); err != nil {
			return err
		}
	}
	if step == nil {
		return fmt.Errorf("%w: adamw step is missing", tensor.ErrShape)
	}
	if step.DType != tensor.I32 {
		return fmt.Errorf("%w: adamw step is %v, want i32", tensor.ErrDType, step.DType)
	}
	if step.Numel() != 1 {
		return fmt.Errorf("%w: adamw step is %v, want one element", tensor.ErrShape, step.Shape)
	}
	if err := e.checkPlace("adamw step", step); err != nil {
		return err
	}
	return e.impl.AdamW(params, grads, m, v, step, cfg)
}

// SGD applies one step of SGD with momentum (PyTorch's torch.optim.SGD with
// dampening 0, not Nesterov; see SGDConfig) to params in place, with momentum
// buffers mom (same shapes, f32, zero before the first step; used even when
// Momentum is 0). Errors as AdamW.
func (e *Engine) SGD(params, grads, mom []*tensor.Tensor, cfg SGDConfig) error {
	if !(cfg.LR >= 0 && cfg.Momentum >= 0 && cfg.WeightDecay >= 0) {
		return fmt.Errorf("%w: SGD %+v", ErrConfig, cfg)
	}
	if err := e.checkGroups("sgd", []string{"params", "grads", "mom"}, params, grads, mom); err != nil {
		return err
	}
	return e.impl.SGD(params, grads, mom, cfg)
}

// Argmax writes out[M] (i32) = the index of the largest element of each row
// of x[M,N] (f32), the first such index on ties. Errors as Linear.
func (e *Engine) Argmax(out, x *tensor.Tensor) error {
	m, n, err := matrix("argmax x", x)
	if err != nil {
		return err
	}
	if err := e.check("argmax x", x, tensor.F32, m, n); err != nil {
		return err
	}
	if err := e.check("argmax out", out, tensor.I32, m); err != nil {
		return err
	}
	return e.impl.Argmax(out, x)
}

// Fill sets every element of a contiguous f32 or i32 tensor to v (converted
// to the dtype; for i32, v must be an integer in range, else ErrConfig).
func (e *Engine) Fill(t *tensor.Tensor, v float64) error {
	if t == nil {
		return fmt.Errorf("%w: fill tensor is missing", tensor.ErrShape)
	}
	switch t.DType {
	case tensor.F32:
	case tensor.I32:
		if v != float64(int32(v)) {
			return fmt.Errorf("%w: fill value %v is not an i32", ErrConfig, v)
		}
	default:
		return fmt.Errorf("%w: fill of %v (want f32 or i32)", tensor.ErrDType, t.DType)
	}
	if err := e.checkPlace("fill tensor", t); err != nil {
		return err
	}
	if t.Numel() == 0 {
		return nil
	}
	return e.impl.Fill(t, v)
}
