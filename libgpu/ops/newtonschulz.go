package ops

// The newtonschulz family: Muon's orthogonalisation of the momentum
// (NewtonSchulz, batched GEMMs of the GEMM family, in bf16 by default) and
// its element-wise steps before and after it (MuonPrep, MuonApply;
// libgpu/kernels/newtonschulz.cu). Reference and checks:
// opstest/newtonschulz.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// The quintic Newton–Schulz coefficients of Muon (Jordan et al. 2024,
// "Muon: an optimizer for hidden layers in neural networks",
// kellerjordan.github.io/posts/muon): chosen to push every singular value
// in (0, 1] towards 1 fast, not to converge exactly (the result's singular
// values land in about [0.7, 1.2]).
const (
	MuonA float32 = 3.4445
	MuonB float32 = -4.7750
	MuonC float32 = 2.0315
)

// NewtonSchulz describes Muon's orthogonalisation of X in place.
type NewtonSchulz struct {
	// X is [r, c] or [L, r, c] (a batch of L matrices), f32 or bf16,
	// contiguous, with r ≤ c (transpose a tall matrix first: the products
	// are then of the smaller Gram matrix). It should have a spectral norm
	// at most 1 (MuonPrep divides by the Frobenius norm).
	X *tensor.Tensor
	// Steps is the number of iterations (0: 5).
	Steps int
	// A, B, C are the coefficients (all 0: MuonA, MuonB, MuonC).
	A, B, C float32
}

// NewtonSchulz runs, Steps times on every matrix X of the batch,
//
//	A = X·Xᵀ;  B = b·A + c·A·A;  X ← a·X + B·X
//
// (Jordan et al. 2024; each step maps a singular value σ to
// aσ + bσ³ + cσ⁵). The products are the GEMM family's in X's dtype with
// f32 accumulation (bf16: tensor cores, as Muon runs it). Scratch: two
// [L, r, r] and one [L, r, c] of X's dtype. Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or ErrConfig.
func (e *Engine) NewtonSchulz(ns NewtonSchulz) error {
	x := ns.X
	if err := e.checkView("newton-schulz X", x, true, floatTypes); err != nil {
		return err
	}
	if x.Rank() != 2 && x.Rank() != 3 {
		return fmt.Errorf("%w: newton-schulz X is %v, want [r, c] or [L, r, c]", tensor.ErrShape, x.Shape)
	}
	r, c := x.Dim(-2), x.Dim(-1)
	batch := 1
	if x.Rank() == 3 {
		batch = x.Dim(0)
	}
	if r < 1 || r > c || batch < 1 {
		return fmt.Errorf("%w: newton-schulz X is %v, want r ≤ c (transpose tall matrices)", tensor.ErrShape, x.Shape)
	}
	steps := ns.Steps
	if steps == 0 {
		steps = 5
	}
	a, b, cc := ns.A, ns.B, ns.C
	if a == 0 && b == 0 && cc == 0 {
		a, b, cc = MuonA, MuonB, MuonC
	}
	if steps < 0 || steps > 100 {
		return fmt.Errorf("%w: newton-schulz steps %d", ErrConfig, steps)
	}
	x3, err := x.View(batch, r, c)
	if err != nil {
		return err
	}
	gram, err := e.ScratchTensor("ns.gram", x.DType, batch, r, r)
	if err != nil {
		return err
	}
	poly, err := e.ScratchTensor("ns.poly", x.DType, batch, r, r)
	if err != nil {
		return err
	}
	next, err := e.ScratchTensor("ns.next", x.DType, batch, r, c)
	if err != nil {
		return err
	}
	cur := x3
	for k := 0; k < steps; k++ {
		if err := e.Matmul(Matmul{A: cur, B: cur, D: gram, TransB: true}); err != nil {
			return err
		}
		// poly = b·gram + c·gram² (b = 0: the product alone).
		if err := e.scaledProduct(poly, gram, gram, gram, b, cc); err != nil {
			return err
		}
		// next = a·cur + poly·cur.
		if err := e.scaledProduct(next, poly, cur, cur, a, 1); err != nil {
			return err
		}
		cur, next = next, cur
	}
	if cur != x3 {
		return e.Copy(x3, cur)
	}
	return nil
}

// scaledProduct computes d = beta·c + alpha·a·b with the GEMM family (c
// copied into d first; beta 0 skips it). d must differ from a, b and c.
func (e *Engine) scaledProduct(d, a, b, c *tensor.Tensor, beta, alpha float32) error {
	if beta == 0 {
		return e.Matmul(Matmul{A: a, B: b, D: d, Alpha: alpha})
	}
	if err := e.Copy(d, c); err != nil {
		return err
	}
	return e.Matmul(Matmul{A: a, B: b, D: d, Alpha: alpha, Beta: beta, Accumulate: true})
}

// muonGeom checks a parameter-shaped f32 tensor p [m, n] and the matrix
// x ([m, n], or [n, m] transposed) and says whether x is transposed.
func (e *Engine) muonGeom(op string, p, x *tensor.Tensor) (m, n int, transpose bool, err error) {
	if err := e.checkView(op+" parameter", p, true, f32Only); err != nil {
		return 0, 0, false, err
	}
	if p.Rank() != 2 {
		return 0, 0, false, fmt.Errorf("%w: %s parameter is %v, want a matrix", tensor.ErrShape, op, p.Shape)
	}
	m, n = p.Dim(0), p.Dim(1)
	if err := e.checkView(op+" X", x, true, floatTypes); err != nil {
		return 0, 0, false, err
	}
	switch {
	case tensor.SameShape(x.Shape, []int{m, n}):
	case tensor.SameShape(x.Shape, []int{n, m}):
		transpose = true
	default:
		return 0, 0, false, fmt.Errorf("%w: %s X is %v for a %d×%d parameter", tensor.ErrShape, op, x.Shape, m, n)
	}
	return m, n, transpose, checkDims(m, n, m*n)
}

// MuonPrep is Muon's momentum and normalisation of one parameter (see
// Engine.MuonPrep).
type MuonPrep struct {
	G, Buf   *tensor.Tensor // [m, n] f32: the gradient and the momentum buffer (updated)
	X        *tensor.Tensor // [m, n], or [n, m] (transposed), f32 or bf16: the output
	Mu       float32        // momentum (Muon: 0.95)
	Nesterov bool
	Eps      float32 // 0: 1e-7
}

// MuonPrep updates the momentum buffer and writes the matrix Newton–Schulz
// orthogonalises (Jordan et al. 2024):
//
//	buf ← μ·buf + g;   u = g + μ·buf (Nesterov) or buf
//	X = u/(‖u‖_F + ε)   (transposed when X is [n, m])
func (e *Engine) MuonPrep(mp MuonPrep) error { return e.MuonPreps([]MuonPrep{mp}) }

// MuonPreps is MuonPrep for several weights at once (on a GPU three
// multi-tensor launches per 32 weights: the momentum with per-block sums
// of squares, the norms, the normalised outputs). They share Mu, Nesterov,
// Eps and X's dtype (else ErrConfig).
func (e *Engine) MuonPreps(ps []MuonPrep) error {
	if len(ps) == 0 {
		return nil
	}
	p0 := ps[0]
	geo := make([][3]int, len(ps)) // m, n, transposed
	for i, mp := range ps {
		m, n, tr, err := e.muonGeom("muon prep", mp.G, mp.X)
		if err != nil {
			return err
		}
		if err := e.checkView("muon prep buffer", mp.Buf, true, f32Only, m, n); err != nil {
			return err
		}
		if mp.Mu != p0.Mu || mp.Nesterov != p0.Nesterov || mp.Eps != p0.Eps || mp.X.DType != p0.X.DType {
			return fmt.Errorf("%w: muon prep %d's settings or X dtype differ from the first's", ErrConfig, i)
		}
		geo[i] = [3]int{m, n, 0}
		if tr {
			geo[i][2] = 1
		}
	}
	eps := p0.Eps
	if eps == 0 {
		eps = 1e-7
	}
	if !(p0.Mu >= 0 && p0.Mu < 1 && eps > 0) {
		return fmt.Errorf("%w: muon μ %v, ε %v", ErrConfig, p0.Mu, eps)
	}
	return e.dispatch(func(*hostImpl) error {
		for i, mp := range ps {
			if err := hostMuonPrep(mp, geo[i], eps); err != nil {
				return err
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		return mtEach(muonSizes(geo), func(g mtGroup) error {
			blocks, count := g.blocks(), g.hi-g.lo
			part, err := c.Scratch("muon.part", int64(blocks)*4+int64(count)*4)
			if err != nil {
				return err
			}
			a := &launch.MuonArgs{Start: g.start, Count: int32(count), Mu: p0.Mu, Eps: eps, Nesterov: launch.Bool(p0.Nesterov),
				Part: part, Inv: part.Add(int64(blocks) * 4)}
			for i := g.lo; i < g.hi; i++ {
				mp := ps[i]
				a.T[i-g.lo] = launch.MuonTensor{G: devPtr(mp.G), Buf: devPtr(mp.Buf), X: devPtr(mp.X),
					M: int32(geo[i][0]), N: int32(geo[i][1]), Transpose: int32(geo[i][2])}
			}
			if err := launch.MuonMomentumMulti(c, grid1(int(blocks)), block1(mtBlock), 0, a); err != nil {
				return err
			}
			if err := launch.MuonScaleMulti(c, grid1((count+31)/32), block1(32), 0, a); err != nil {
				return err
			}
			return launch.MuonNormalizeMulti(c, dtName(p0.X.DType), grid1(int(blocks)), block1(mtBlock), 0, a)
		})
	})
}

// muonSizes is the element count of each weight of geo (m, n, transposed).
func muonSizes(geo [][3]int) []int {
	n := make([]int, len(geo))
	for i, g := range geo {
		n[i] = g[0] * g[1]
	}
	return n
}

// hostMuonPrep is one weight's MuonPrep on the host.
func hostMuonPrep(mp MuonPrep, geo [3]int, eps float32) error {
	m, n, tr := geo[0], geo[1], geo[2] == 1
	g, _ := mp.G.F32()
	buf, _ := mp.Buf.F32()
	u := make([]float32, len(g))
	var ss float64
	for k := range g {
		buf[k] = mp.Mu*buf[k] + g[k]
		u[k] = buf[k]
		if mp.Nesterov {
			u[k] = g[k] + mp.Mu*buf[k]
		}
		ss += float64(u[k]) * float64(u[k])
	}
	s := float32(1 / (math.Sqrt(ss) + float64(eps)))
	out := make([]float32, len(g))
	for k := range u {
		o := k
		if tr {
			o = (k%n)*m + k/n
		}
		out[o] = u[k] * s
	}
	return mp.X.WriteFloat32(out)
}

// MuonApply updates the parameter P ([m, n] f32) from the orthogonalised
// X ([m, n], or [n, m] transposed; f32 or bf16):
//
//	p ← p·(1 − lr·decay) − lr·scale·o
//
// Muon's step with decoupled weight decay; Jordan et al. use scale =
// max(1, m/n)^½. lrScale, when not nil, is an f32 scalar on the device
// that multiplies lr when the update runs (a learning-rate schedule a
// captured graph follows, as AdamWConfig.LRScale).
func (e *Engine) MuonApply(p, x, lrScale *tensor.Tensor, lr, scale, decay float32) error {
	return e.MuonApplies([]MuonWeight{{P: p, X: x, Scale: scale}}, lrScale, lr, decay)
}

// MuonWeight is one weight of MuonApplies: the parameter, its
// orthogonalised update and its step scale.
type MuonWeight struct {
	P, X  *tensor.Tensor
	Scale float32
}

// MuonApplies is MuonApply for several weights at once, with one
// learning rate, scale tensor and decay (on a GPU one multi-tensor launch
// per 32 weights). The X share a dtype (else ErrConfig).
func (e *Engine) MuonApplies(ws []MuonWeight, lrScale *tensor.Tensor, lr, decay float32) error {
	if len(ws) == 0 {
		return nil
	}
	geo := make([][3]int, len(ws))
	for i, w := range ws {
		m, n, tr, err := e.muonGeom("muon apply", w.P, w.X)
		if err != nil {
			return err
		}
		if w.X.DType != ws[0].X.DType {
			return fmt.Errorf("%w: muon apply %d's X is %v, the first's %v", ErrConfig, i, w.X.DType, ws[0].X.DType)
		}
		geo[i] = [3]int{m, n, 0}
		if tr {
			geo[i][2] = 1
		}
	}
	if lrScale != nil {
		if err := e.checkView("muon apply lr scale", lrScale, true, f32Only, 1); err != nil {
			return err
		}
	}
	return e.dispatch(func(*hostImpl) error {
		l := lr
		if lrScale != nil {
			sv, err := hostIn(lrScale)
			if err != nil {
				return err
			}
			l *= sv[0]
		}
		for i, w := range ws {
			pv, _ := w.P.F32()
			xv, err := hostIn(w.X)
			if err != nil {
				return err
			}
			m, n, tr := geo[i][0], geo[i][1], geo[i][2] == 1
			for k := range pv {
				o := k
				if tr {
					o = (k%n)*m + k/n
				}
				pv[k] = pv[k]*(1-l*decay) - l*w.Scale*xv[o]
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		return mtEach(muonSizes(geo), func(g mtGroup) error {
			a := &launch.MuonArgs{Start: g.start, Count: int32(g.hi - g.lo), Lr: lr, Decay: decay, LrScale: devPtr(lrScale)}
			for i := g.lo; i < g.hi; i++ {
				w := ws[i]
				a.T[i-g.lo] = launch.MuonTensor{P: devPtr(w.P), X: devPtr(w.X), M: int32(geo[i][0]), N: int32(geo[i][1]),
					Transpose: int32(geo[i][2]), Scale: w.Scale}
			}
			return launch.MuonApplyMulti(c, dtName(ws[0].X.DType), grid1(int(g.blocks())), block1(mtBlock), 0, a)
		})
	})
}
