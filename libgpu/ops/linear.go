package ops

// The linear family: a fully connected layer y = act(x·wᵀ + b) in f32 at
// the engine's precision, with cuBLASLt's fused epilogues (bias, ReLU,
// GELU, the ReLU bit-mask) and its backward, per layer (LinearBackward) or
// chained across layers (chain.go, LinearBackwardChain): the hand-written
// MLP's layers (libgpu/nn.MLP). Kernels: libgpu/kernels/ops_linear.cu; the
// CUDA mapping onto cuBLASLt is described in cuda_linear.go. Models
// recorded on a Graph use Graph.Linear (the GEMM family, matmul.go)
// instead. Reference and checks: opstest/check.go, opstest/chain.go.

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"

	"gpukit/libgpu/exec"
	"gpukit/libgpu/tensor"
)

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
// HasLinearChain only, else exec.ErrNoBackend). Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
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
			return fmt.Errorf("%w: %v has no ReLU bit-masks", exec.ErrNoBackend, e.Device())
		}
	case aux != nil:
		if err := e.check("linear aux", aux, tensor.F32, m, n); err != nil {
			return err
		}
	}
	return e.dispatch(func(h *hostImpl) error { return h.linear(y, x, w, b, aux, act) },
		func(c *cudaImpl) error { return c.linear(y, x, w, b, aux, act) })
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
	return e.dispatch(func(h *hostImpl) error { return h.linearBackward(dx, dw, db, dy, x, w, aux, act) },
		func(c *cudaImpl) error { return c.linearBackward(dx, dw, db, dy, x, w, aux, act) })
}

// GELU tanh-approximation constants (Hendrycks & Gimpel 2016).
const (
	geluC = 0.7978845608028654 // √(2/π)
	geluA = 0.044715
)

func geluF(z float32) float32 {
	x := float64(z)
	return float32(0.5 * x * (1 + math.Tanh(geluC*(x+geluA*x*x*x))))
}

// geluGrad is d/dz of 0.5z(1+tanh(u)), u = c(z + a z³).
func geluGrad(z float32) float32 {
	x := float64(z)
	t := math.Tanh(geluC * (x + geluA*x*x*x))
	return float32(0.5*(1+t) + 0.5*x*(1-t*t)*geluC*(1+3*geluA*x*x))
}

func f32s(ts ...*tensor.Tensor) ([][]float32, error) {
	out := make([][]float32, len(ts))
	for i, t := range ts {
		if t == nil {
			continue
		}
		s, err := t.F32()
		if err != nil {
			return nil, fmt.Errorf("ops: host backend: %w", err)
		}
		out[i] = s
	}
	return out, nil
}

// hostLinearState is the host backend's dz buffer of LinearBackward,
// grown on demand.
type hostLinearState struct{ dz []float32 }

func (h *hostImpl) linear(y, x, w, b, aux *tensor.Tensor, act Act) error {
	var mask []uint8 // u8 aux: the ReLU bit-mask, from y > 0 ⇔ z > 0
	if aux != nil && aux.DType == tensor.U8 {
		var err error
		if mask, err = aux.U8(); err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		aux = nil
	}
	s, err := f32s(y, x, w, b, aux)
	if err != nil {
		return err
	}
	ys, xs, ws, bs, zs := s[0], s[1], s[2], s[3], s[4]
	m, k, n := x.Shape[0], x.Shape[1], w.Shape[0]
	h.blas.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, xs, k, ws, k, 0, ys, n)
	for i := 0; i < m; i++ {
		row := ys[i*n : (i+1)*n]
		for j := range row {
			z := row[j]
			if bs != nil {
				z += bs[j]
			}
			if zs != nil {
				zs[i*n+j] = z
			}
			switch act {
			case ActReLU:
				if !(z > 0) {
					z = 0
				}
			case ActGELU:
				z = geluF(z)
			}
			row[j] = z
		}
	}
	if mask != nil {
		writeReLUMask(mask, ys, m, n)
	}
	return nil
}

func (h *hostImpl) linearBackward(dx, dw, db, dy, x, w, aux *tensor.Tensor, act Act) error {
	st := exec.StateOf[hostLinearState](h.Host)
	s, err := f32s(dx, dw, db, dy, x, w, aux)
	if err != nil {
		return err
	}
	dxs, dws, dbs, dys, xs, ws, as := s[0], s[1], s[2], s[3], s[4], s[5], s[6]
	m, k, n := x.Shape[0], x.Shape[1], w.Shape[0]
	dz := dys
	if act != ActNone {
		if cap(st.dz) < m*n {
			st.dz = make([]float32, m*n)
		}
		dz = st.dz[:m*n]
		for i, g := range dys {
			switch act {
			case ActReLU:
				if as[i] > 0 {
					dz[i] = g
				} else {
					dz[i] = 0
				}
			case ActGELU:
				dz[i] = g * geluGrad(as[i])
			}
		}
	}
	// dw[N,K] = dzᵀ[N,M]·x[M,K]
	h.blas.Sgemm(blas.Trans, blas.NoTrans, n, k, m, 1, dz, n, xs, k, 0, dws, k)
	if dxs != nil {
		// dx[M,K] = dz[M,N]·w[N,K]
		h.blas.Sgemm(blas.NoTrans, blas.NoTrans, m, k, n, 1, dz, n, ws, k, 0, dxs, k)
	}
	if dbs != nil {
		for j := range dbs {
			dbs[j] = 0
		}
		for i := 0; i < m; i++ {
			for j, g := range dz[i*n : (i+1)*n] {
				dbs[j] += g
			}
		}
	}
	return nil
}
