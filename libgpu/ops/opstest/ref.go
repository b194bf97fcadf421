package opstest

import (
	"math"
	"math/rand/v2"

	"gpukit/libgpu/ops"
)

// Rand returns n draws from U(−1, 1).
func Rand(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(2*r.Float64() - 1)
	}
	return v
}

// F64 widens a float32 slice.
func F64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// F32 narrows a float64 slice (round to nearest).
func F32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// FiniteDiff returns the central-difference gradient of f at x,
// (f(x+h·eᵢ) − f(x−h·eᵢ)) / 2h for every i. x is restored on return.
func FiniteDiff(f func(x []float64) float64, x []float64, h float64) []float64 {
	g := make([]float64, len(x))
	for i := range x {
		old := x[i]
		x[i] = old + h
		fp := f(x)
		x[i] = old - h
		fm := f(x)
		x[i] = old
		g[i] = (fp - fm) / (2 * h)
	}
	return g
}

// ActRef is the activation in float64: identity, max(0, z), or the tanh
// approximation of GELU 0.5z(1+tanh(√(2/π)(z+0.044715z³))).
func ActRef(act ops.Act, z float64) float64 {
	switch act {
	case ops.ActReLU:
		return math.Max(0, z)
	case ops.ActGELU:
		return 0.5 * z * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(z+0.044715*z*z*z)))
	}
	return z
}

// ActGradRef is d ActRef / dz (0 at z = 0 for ReLU, as PyTorch).
func ActGradRef(act ops.Act, z float64) float64 {
	switch act {
	case ops.ActReLU:
		if z > 0 {
			return 1
		}
		return 0
	case ops.ActGELU:
		c := math.Sqrt(2 / math.Pi)
		t := math.Tanh(c * (z + 0.044715*z*z*z))
		return 0.5*(1+t) + 0.5*z*(1-t*t)*c*(1+3*0.044715*z*z)
	}
	return 1
}

// LinearRef returns z = x·wᵀ + b and y = act(z) for row-major x[m,k],
// w[n,k], b[n] (b may be nil).
func LinearRef(x, w, b []float64, m, k, n int, act ops.Act) (y, z []float64) {
	y, z = make([]float64, m*n), make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				s += x[i*k+p] * w[j*k+p]
			}
			if b != nil {
				s += b[j]
			}
			z[i*n+j] = s
			y[i*n+j] = ActRef(act, s)
		}
	}
	return y, z
}

// LinearBackwardRef returns dx[m,k], dw[n,k], db[n] for dy[m,n] given the
// pre-activation z[m,n].
func LinearBackwardRef(dy, x, w, z []float64, m, k, n int, act ops.Act) (dx, dw, db []float64) {
	dz := make([]float64, m*n)
	for i := range dz {
		dz[i] = dy[i] * ActGradRef(act, z[i])
	}
	dx, dw, db = make([]float64, m*k), make([]float64, n*k), make([]float64, n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			g := dz[i*n+j]
			db[j] += g
			for p := 0; p < k; p++ {
				dx[i*k+p] += g * w[j*k+p]
				dw[j*k+p] += g * x[i*k+p]
			}
		}
	}
	return dx, dw, db
}

// SoftmaxCrossEntropyRef returns the mean cross-entropy of logits[m,c]
// against labels and its gradient (softmax − onehot)/m.
func SoftmaxCrossEntropyRef(logits []float64, labels []int32, m, c int) (loss float64, dlogits []float64) {
	dlogits = make([]float64, m*c)
	for i := 0; i < m; i++ {
		row := logits[i*c : (i+1)*c]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, v)
		}
		var s float64
		for _, v := range row {
			s += math.Exp(v - mx)
		}
		lse := mx + math.Log(s)
		loss += lse - row[labels[i]]
		for j, v := range row {
			dlogits[i*c+j] = math.Exp(v-lse) / float64(m)
		}
		dlogits[i*c+int(labels[i])] -= 1 / float64(m)
	}
	return loss / float64(m), dlogits
}

// CrossEntropyTerms returns the terms' size of SoftmaxCrossEntropyRef's
// results (TermsErr): per row, the stable log-sum-exp sums exp(x − max),
// which includes the maximum's own 1, so it is known to the precision of
// 1, plus |x_label − max|; the mean of those is the loss's terms. The
// gradient (p − onehot)/m sums p and the one-hot: (p + onehot)/m.
func CrossEntropyTerms(logits []float64, labels []int32, m, c int) (loss float64, dlogits []float64) {
	dlogits = make([]float64, m*c)
	_, d := SoftmaxCrossEntropyRef(logits, labels, m, c)
	for i := 0; i < m; i++ {
		row := logits[i*c : (i+1)*c]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, v)
		}
		loss += 1 + math.Abs(row[labels[i]]-mx)
		for j := range row {
			dlogits[i*c+j] = math.Abs(d[i*c+j])
		}
		dlogits[i*c+int(labels[i])] += 2 / float64(m)
	}
	return loss / float64(m), dlogits
}

// AdamWTermsRef advances the terms' sizes tp of p and tm of m (TermsErr)
// through AdamW step t, before AdamWRef takes the same step: m sums
// β1·m and (1−β1)·g, p sums (1−lr·wd)·p and the step lr·m̂/(√v̂ + eps),
// whose error follows m̂'s terms. v sums squares: its terms are itself.
func AdamWTermsRef(tp, tm, g, v []float64, t int, cfg ops.AdamWConfig) {
	lr, b1, b2 := float64(cfg.LR), float64(cfg.Beta1), float64(cfg.Beta2)
	eps, wd := float64(cfg.Eps), float64(cfg.WeightDecay)
	bc1 := 1 - math.Pow(b1, float64(t))
	bc2 := 1 - math.Pow(b2, float64(t))
	for i := range tp {
		tm[i] = b1*tm[i] + (1-b1)*math.Abs(g[i])
		vn := b2*v[i] + (1-b2)*g[i]*g[i]
		tp[i] = math.Abs(1-lr*wd)*tp[i] + lr*(tm[i]/bc1)/(math.Sqrt(vn/bc2)+eps)
	}
}

// SGDTermsRef advances the terms' sizes tp of p and tb of buf through
// one SGDRef step (before it): buf sums μ·buf, g and wd·p; p sums p and
// lr·buf.
func SGDTermsRef(tp, tb, g []float64, cfg ops.SGDConfig) {
	lr, mu, wd := float64(cfg.LR), float64(cfg.Momentum), float64(cfg.WeightDecay)
	for i := range tp {
		tb[i] = mu*tb[i] + math.Abs(g[i]) + wd*tp[i]
		tp[i] += lr * tb[i]
	}
}

// AdamWRef applies AdamW step t (1-based) in place, as torch.optim.AdamW:
// p ← p(1 − lr·wd) then p ← p − lr·m̂/(√v̂ + eps).
func AdamWRef(p, g, m, v []float64, t int, cfg ops.AdamWConfig) {
	lr, b1, b2 := float64(cfg.LR), float64(cfg.Beta1), float64(cfg.Beta2)
	eps, wd := float64(cfg.Eps), float64(cfg.WeightDecay)
	bc1 := 1 - math.Pow(b1, float64(t))
	bc2 := 1 - math.Pow(b2, float64(t))
	for i := range p {
		p[i] *= 1 - lr*wd
		m[i] = b1*m[i] + (1-b1)*g[i]
		v[i] = b2*v[i] + (1-b2)*g[i]*g[i]
		p[i] -= lr * (m[i] / bc1) / (math.Sqrt(v[i]/bc2) + eps)
	}
}

// SGDRef applies one step of torch.optim.SGD (dampening 0, no Nesterov) in
// place, with buf zero before the first step.
func SGDRef(p, g, buf []float64, cfg ops.SGDConfig) {
	lr, mu, wd := float64(cfg.LR), float64(cfg.Momentum), float64(cfg.WeightDecay)
	for i := range p {
		d := g[i] + wd*p[i]
		buf[i] = mu*buf[i] + d
		p[i] -= lr * buf[i]
	}
}

// ArgmaxRef is the first index of the maximum of each row of x[m,n].
func ArgmaxRef(x []float32, m, n int) []int32 {
	out := make([]int32, m)
	for i := 0; i < m; i++ {
		best := 0
		for j := 1; j < n; j++ {
			if x[i*n+j] > x[i*n+best] {
				best = j
			}
		}
		out[i] = int32(best)
	}
	return out
}

// ReLUMaskRef is the ReLU bit-mask of z[m,n] (ops.ReLUMaskCols): m rows of
// ops.ReLUMaskCols(n) bytes, bit j%8 of byte [i, j/8] set when z[i,j] > 0,
// padding bits 0 (a backend's padding bits are not compared).
func ReLUMaskRef(z []float64, m, n int) []uint8 {
	ld := ops.ReLUMaskCols(n)
	out := make([]uint8, m*ld)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			if z[i*n+j] > 0 {
				out[i*ld+j/8] |= 1 << (j % 8)
			}
		}
	}
	return out
}

// LinearBackwardChainRef is ops.Engine.LinearBackwardChain in float64, for
// dz[m,n], x[m,k], w[n,k] and the previous layer's pre-activation
// zPrev[m,k] (read only for actPrev ≠ ActNone): dw = dzᵀ·x, db = Σ_rows dz,
// dxPrev = (dz·w) ⊙ act_prev'(zPrev), dbPrev = Σ_rows dxPrev.
func LinearBackwardChainRef(dz, x, w, zPrev []float64, m, k, n int, actPrev ops.Act) (dxPrev, dw, db, dbPrev []float64) {
	dxPrev, dw, db, dbPrev = make([]float64, m*k), make([]float64, n*k), make([]float64, n), make([]float64, k)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			g := dz[i*n+j]
			db[j] += g
			for p := 0; p < k; p++ {
				dxPrev[i*k+p] += g * w[j*k+p]
				dw[j*k+p] += g * x[i*k+p]
			}
		}
	}
	for i := range dxPrev {
		if actPrev != ops.ActNone {
			dxPrev[i] *= ActGradRef(actPrev, zPrev[i])
		}
		dbPrev[i%k] += dxPrev[i]
	}
	return dxPrev, dw, db, dbPrev
}
