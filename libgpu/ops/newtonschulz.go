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
func (e *Engine) MuonPrep(mp MuonPrep) error {
	m, n, tr, err := e.muonGeom("muon prep", mp.G, mp.X)
	if err != nil {
		return err
	}
	if err := e.checkView("muon prep buffer", mp.Buf, true, f32Only, m, n); err != nil {
		return err
	}
	eps := mp.Eps
	if eps == 0 {
		eps = 1e-7
	}
	if !(mp.Mu >= 0 && mp.Mu < 1 && eps > 0) {
		return fmt.Errorf("%w: muon μ %v, ε %v", ErrConfig, mp.Mu, eps)
	}
	total := int64(m) * int64(n)
	return e.dispatch(func(*hostImpl) error {
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
	}, func(c *cudaImpl) error {
		chunks := int(min(max((total+8191)/8192, 1), 64))
		part, err := c.Scratch("muon.part", int64(chunks)*4+4)
		if err != nil {
			return err
		}
		scale := part.Add(int64(chunks) * 4)
		if err := launch.MuonMomentum(c, grid1(chunks), block1(256), 0,
			devPtr(mp.G), devPtr(mp.Buf), part, total, int32(chunks), mp.Mu, launch.Bool(mp.Nesterov)); err != nil {
			return err
		}
		if err := launch.MuonScale(c, grid1(1), block1(32), 0, part, int32(chunks), eps, scale); err != nil {
			return err
		}
		return launch.MuonNormalize(c, dtName(mp.X.DType), gridFor(total, 256), block1(256), 0,
			devPtr(mp.G), devPtr(mp.Buf), scale, devPtr(mp.X), int32(m), int32(n), launch.Bool(tr), mp.Mu, launch.Bool(mp.Nesterov))
	})
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
	m, n, tr, err := e.muonGeom("muon apply", p, x)
	if err != nil {
		return err
	}
	if lrScale != nil {
		if err := e.checkView("muon apply lr scale", lrScale, true, f32Only, 1); err != nil {
			return err
		}
	}
	total := int64(m) * int64(n)
	return e.dispatch(func(*hostImpl) error {
		pv, _ := p.F32()
		xv, err := hostIn(x)
		if err != nil {
			return err
		}
		if lrScale != nil {
			sv, err := hostIn(lrScale)
			if err != nil {
				return err
			}
			lr *= sv[0]
		}
		for k := range pv {
			o := k
			if tr {
				o = (k%n)*m + k/n
			}
			pv[k] = pv[k]*(1-lr*decay) - lr*scale*xv[o]
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.MuonApply(c, dtName(x.DType), gridFor(total, 256), block1(256), 0,
			devPtr(p), devPtr(x), int32(m), int32(n), launch.Bool(tr), lr, scale, decay, devPtr(lrScale))
	})
}
