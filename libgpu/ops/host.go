package ops

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

func init() {
	Register(device.KindHost, func(device.Device, Options) (Impl, error) { return &hostImpl{}, nil })
}

// hostImpl is the CPU backend: plain Go loops, GEMMs through gonum's
// row-major BLAS (blas/gonum.Implementation.Sgemm). Every precision is
// computed in f32. The Engine has validated shapes, dtypes and devices; the
// slices come from tensor.F32/I32, which fail for non-host memory.
type hostImpl struct {
	blas    gonum.Implementation
	scratch []float32           // dz for LinearBackward, grown on demand
	tmp     map[string][]uint64 // scratch tensors of composite ops (scratch.go)
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

func (h *hostImpl) Linear(y, x, w, b, aux *tensor.Tensor, act Act) error {
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

func (h *hostImpl) LinearBackward(dx, dw, db, dy, x, w, aux *tensor.Tensor, act Act) error {
	s, err := f32s(dx, dw, db, dy, x, w, aux)
	if err != nil {
		return err
	}
	dxs, dws, dbs, dys, xs, ws, as := s[0], s[1], s[2], s[3], s[4], s[5], s[6]
	m, k, n := x.Shape[0], x.Shape[1], w.Shape[0]
	dz := dys
	if act != ActNone {
		if cap(h.scratch) < m*n {
			h.scratch = make([]float32, m*n)
		}
		dz = h.scratch[:m*n]
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

func (h *hostImpl) SoftmaxCrossEntropy(loss, dlogits, logits, labels *tensor.Tensor) error {
	s, err := f32s(loss, dlogits, logits)
	if err != nil {
		return err
	}
	ls, ds, xs := s[0], s[1], s[2]
	lab, err := labels.I32()
	if err != nil {
		return fmt.Errorf("ops: host backend: %w", err)
	}
	m, c := logits.Shape[0], logits.Shape[1]
	for i, l := range lab {
		if l < 0 || int(l) >= c {
			return fmt.Errorf("%w: labels[%d] = %d, classes %d", ErrLabel, i, l, c)
		}
	}
	invM := 1 / float64(m)
	var total float64
	for i := 0; i < m; i++ {
		row := xs[i*c : (i+1)*c]
		drow := ds[i*c : (i+1)*c]
		mx := row[0]
		for _, v := range row[1:] {
			if v > mx {
				mx = v
			}
		}
		var sum float64
		for j, v := range row {
			e := math.Exp(float64(v - mx))
			drow[j] = float32(e) // temporarily exp(x − max)
			sum += e
		}
		// −log softmax[l] = log Σ exp(x − max) − (x_l − max)
		l := lab[i]
		total += math.Log(sum) - float64(row[l]-mx)
		inv := invM / sum
		for j := range drow {
			drow[j] = float32(float64(drow[j]) * inv)
		}
		drow[l] -= float32(invM)
	}
	ls[0] = float32(total * invM)
	return nil
}

func (h *hostImpl) AdamW(params, grads, m, v []*tensor.Tensor, step *tensor.Tensor, cfg AdamWConfig) error {
	st, err := step.I32()
	if err != nil {
		return fmt.Errorf("ops: host backend: %w", err)
	}
	t := float64(st[0]) + 1
	bc1 := 1 - math.Pow(float64(cfg.Beta1), t)
	bc2 := 1 - math.Pow(float64(cfg.Beta2), t)
	lr, b1, b2 := float64(cfg.LR), float64(cfg.Beta1), float64(cfg.Beta2)
	eps := float64(cfg.Eps)
	if cfg.LRScale != nil {
		sc, err := cfg.LRScale.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		lr = float64(float32(cfg.LR) * sc[0]) // the f32 product, as the kernel forms it
	}
	gsc := float32(1)
	if cfg.GradScale != nil {
		v, err := cfg.GradScale.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		gsc = v[0]
	}
	for i := range params {
		wd := float64(cfg.decay(i))
		s, err := f32s(params[i], grads[i], m[i], v[i])
		if err != nil {
			return err
		}
		ps, gs, ms, vs := s[0], s[1], s[2], s[3]
		for j := range ps {
			gj := gs[j]
			if cfg.GradScale != nil {
				gj *= gsc // the f32 product the CUDA kernel forms
			}
			p, g := float64(ps[j]), float64(gj)
			mj := b1*float64(ms[j]) + (1-b1)*g
			vj := b2*float64(vs[j]) + (1-b2)*g*g
			ms[j], vs[j] = float32(mj), float32(vj)
			ps[j] = float32(p - lr*((mj/bc1)/(math.Sqrt(vj/bc2)+eps)+wd*p))
		}
	}
	st[0]++
	return nil
}

func (h *hostImpl) SGD(params, grads, mom []*tensor.Tensor, cfg SGDConfig) error {
	lr, mu, wd := cfg.LR, cfg.Momentum, cfg.WeightDecay
	for i := range params {
		s, err := f32s(params[i], grads[i], mom[i])
		if err != nil {
			return err
		}
		ps, gs, bs := s[0], s[1], s[2]
		for j := range ps {
			g := gs[j] + wd*ps[j]
			b := mu*bs[j] + g
			bs[j] = b
			ps[j] -= lr * b
		}
	}
	return nil
}

func (h *hostImpl) Argmax(out, x *tensor.Tensor) error {
	xs, err := x.F32()
	if err != nil {
		return fmt.Errorf("ops: host backend: %w", err)
	}
	os, err := out.I32()
	if err != nil {
		return fmt.Errorf("ops: host backend: %w", err)
	}
	m, n := x.Shape[0], x.Shape[1]
	for i := 0; i < m; i++ {
		row := xs[i*n : (i+1)*n]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		os[i] = int32(best)
	}
	return nil
}

func (h *hostImpl) Fill(t *tensor.Tensor, v float64) error {
	switch t.DType {
	case tensor.F32:
		s, err := t.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		f := float32(v)
		for i := range s {
			s[i] = f
		}
	case tensor.I32:
		s, err := t.I32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		for i := range s {
			s[i] = int32(v)
		}
	default:
		return fmt.Errorf("%w: fill of %v", tensor.ErrDType, t.DType)
	}
	return nil
}
