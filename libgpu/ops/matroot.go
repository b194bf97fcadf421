package ops

// The matroot family: batched symmetric eigendecomposition (Eigh) and
// inverse p-th roots of symmetric positive semi-definite matrices
// (InverseRoot), the preconditioners of Shampoo, SOAP and K-FAC. Eigh runs
// gonum's EigenSym in float64 on the host and cuSOLVER's syevd (f32, or
// f64 on request) on CUDA; InverseRoot assembles roots from it, or runs
// the coupled Newton iteration as batched GEMMs (the GEMM family, so
// tensor cores under TF32) with the element-wise and reduction steps in
// libgpu/kernels/matroot.cu. The composite algorithms are written once
// here over primitives with a host and a CUDA implementation each.
// Reference and checks: opstest/matroot.go.

import (
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/mat"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// RootMethod is how InverseRoot computes a root.
type RootMethod uint8

const (
	// RootEigen: X = Qᵀ·diag((max(λ, 0) + r)^(−1/p))·Q from the
	// eigendecomposition A = Qᵀ·diag(λ)·Q (Eigh).
	RootEigen RootMethod = iota
	// RootNewton: the coupled Newton iteration for the inverse p-th root
	// (Guo & Higham 2006, "A Schur–Newton method for the matrix p-th root
	// and its inverse", SIAM J. Matrix Anal. Appl. 28(3), eq. 3.2; the
	// scaling of Anil et al. 2020, "Scalable second order optimization for
	// deep learning", §3.2): with z = (p+1)/(2‖A + rI‖_F),
	//
	//	X₀ = z^(1/p)·I,  M₀ = z·(A + rI)
	//	T_k = ((p+1)·I − M_k)/p
	//	X_{k+1} = X_k·T_k,  M_{k+1} = T_k^p·M_k
	//
	// The iterates are polynomials in A, so M_k = X_k^p·(A + rI) and
	// M_k → I, X_k → (A + rI)^(−1/p). Error bound (exact arithmetic, where
	// the iterates commute): with δ = ‖M_K − I‖_F < 1 after the last
	// iteration, X_K = M_K^(1/p)·(A + rI)^(−1/p), and since
	// |(1+x)^(1/p) − 1| ≤ |x|/(p(1−|x|)) for |x| < 1,
	//
	//	‖X_K − (A + rI)^(−1/p)‖_F / ‖(A + rI)^(−1/p)‖_F ≤ δ/(p·(1 − δ)).
	//
	// InverseRoot.Err reports δ per matrix; rounding (f32, or TF32 tensor
	// cores) adds to it an error of the order of the GEMMs' relative
	// precision times the iteration count (opstest/matroot.go checks the
	// bound against eigendecomposition with that allowance). In finite
	// precision the iteration needs the ridge to stand above the products'
	// rounding: see NewtonTF32MinRelEps; and δ itself, computed in f32,
	// has a rounding floor: see ResidualFloor.
	RootNewton
)

// RootTF32 says whether RootNewton's products may run in TF32.
type RootTF32 uint8

const (
	// RootTF32Auto (the zero value): TF32 tensor cores on an engine whose
	// precision is not PrecF32 when RelEps ≥ NewtonTF32MinRelEps, full f32
	// products (Matmul.FullF32) otherwise.
	RootTF32Auto RootTF32 = iota
	// RootTF32On: the engine's precision whatever the ridge (benchmarks of
	// the instability NewtonTF32MinRelEps avoids).
	RootTF32On
	// RootTF32Off: full f32 products.
	RootTF32Off
)

// NewtonTF32MinRelEps is the smallest relative ridge (InverseRoot.RelEps)
// at which RootNewton computes its products in TF32 by default. The
// iteration starts from M₀ = z(A + rI) with ‖M₀‖_F = (p+1)/2 and smallest
// eigenvalue z·r ≈ (p+1)/2·RelEps; rounding M₀ (and every later M) to
// TF32's 10-bit mantissa (unit roundoff u = 2⁻¹¹ ≈ 4.9e-4) moves its
// eigenvalues by an amount of order u·‖M₀‖_F/n to u·‖M₀‖_F/√n (first order
// for delocalised eigenvectors, spectral norm of the rounding), so below
// RelEps ~ u the small eigenvalues can be pushed negative, and
// m ← ((p+1−m)/p)^p·m then diverges (|m| grows without bound for m < 0).
// In an emulation of TF32 GEMMs (operands rounded to 10 mantissa bits,
// f32 accumulation; the same emulation in plain f32 reproduced an H100's
// f32 Newton error, 6e-6, and residual, 4e-3, at order 512) on Shampoo's
// statistics (GᵀG/k of Gaussian G, orders 45 to 256, rank-deficient and
// full rank) the iteration diverged (NaN) at RelEps ≤ 1e-5 and left
// residuals δ above 1 up to RelEps 5e-4 to 1e-3; from 2e-3 every δ was
// below 0.5 (bench/cmd/gpukit-tf32newton reproduces this). An H100 did
// better than the emulation at order 512 (RelEps 1e-4: error 2.8e-4), so
// the bound may be loosened for large orders on measured evidence
// (bench/roots.sh reports TF32 forced below it, TestCUDANewtonTF32 logs
// it on Shampoo-like statistics).
const NewtonTF32MinRelEps = 2e-3

// ResidualFloor is the rounding floor of the residual δ = ‖X^p(A + rI) −
// I‖_F that InverseRoot.Err reports for an n×n matrix with ridge r and
// nrm = ‖A + rI‖_F: u·√n·nrm/r with u = 2⁻²⁴ (f32). X^p has eigenvalues up
// to 1/r, so forming X^p·A in f32 leaves an error of order u·‖X^p‖·‖A‖ in
// every direction near the ridge: even an exact root shows δ of this
// size. (The same f32 emulation: accurate roots, error ~2e-3, of
// rank-deficient statistics of order 45–256 at RelEps 1e-6 had δ from 0.6
// to 1.25 times this floor, up to δ = 1.14.) 0 when r is 0.
func ResidualFloor(n int, r, nrm float64) float64 {
	if !(r > 0) {
		return 0
	}
	return 0x1p-24 * math.Sqrt(float64(n)) * nrm / r
}

// ResidualAccept is the largest residual δ at which InverseRoot commits a
// Newton root: max(1, 4·ResidualFloor(n, r, nrm)). Below 1, δ bounds the
// root's error (RootNewton); where the floor exceeds 1/4, δ certifies
// nothing beyond its rounding, and the check catches what it can: a
// non-finite or diverged iteration, or one stopped far from convergence.
// (Convergence itself is what the default iteration count guarantees in
// exact arithmetic, and NewtonTF32MinRelEps keeps rounding from undoing
// it.)
func ResidualAccept(n int, r, nrm float64) float64 {
	return math.Max(1, 4*ResidualFloor(n, r, nrm))
}

func (m RootMethod) String() string {
	switch m {
	case RootEigen:
		return "eigen"
	case RootNewton:
		return "newton"
	}
	return fmt.Sprintf("root(%d)", uint8(m))
}

// ParseRootMethod accepts "eigen" and "newton".
func ParseRootMethod(s string) (RootMethod, error) {
	for _, m := range []RootMethod{RootEigen, RootNewton} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("%w: root method %q (want eigen or newton)", ErrConfig, s)
}

// Eigh describes the symmetric eigendecomposition of a batch of matrices:
//
//	A[b] = Q[b]ᵀ·diag(W[b])·Q[b]
//
// A is [n, n] or [B, n, n] f32, contiguous; only its upper triangle
// (row-major: A[i, j], j ≥ i) is read, so A need not be exactly symmetric.
// Q (A's shape, f32) receives orthonormal eigenvectors as its rows, W ([n]
// or [B, n], f32) the eigenvalues in ascending order. Q may be A itself.
//
// On the host the decomposition runs in float64 (gonum's EigenSym); on
// CUDA in f32 (cuSOLVER's syevd), or in float64 with F64. A matrix whose
// decomposition fails (the solver does not converge, or an eigenvalue is
// not finite) keeps the Q and W it had, and Status[b] (optional, [B] i32)
// is 1 for it, 0 for the others: nothing is read back to the host.
type Eigh struct {
	A, Q, W *tensor.Tensor
	F64     bool
	Status  *tensor.Tensor
}

// InverseRoot describes X[b] = (A[b] + r_b·I)^(−1/P) for a batch of
// symmetric positive semi-definite matrices (only the upper triangle of A
// is read, as Eigh reads it), with the ridge
//
//	r_b = Eps + RelEps·‖A[b]‖_F (+ Ridge[b] when Ridge is set)
//
// A and X are [n, n] or [B, n, n] f32, contiguous, of one shape; X may be A
// itself. P ≥ 1 (1: the inverse; Shampoo's 2-D preconditioners use 4).
// Ridge is an optional [B] f32 device tensor (K-FAC's damping). The
// ridge must make A + rI positive definite.
//
// RootEigen uses Eigh (see there for precision and F64); negative
// eigenvalues are clamped to 0 before the ridge is added. RootNewton runs
// Iters iterations (0: NewtonIters(P, RelEps, n), enough from the
// smallest eigenvalue the relative ridge allows) of the GEMM-based coupled
// iteration documented at RootNewton; TF32 chooses the precision of its
// products (the zero value: TF32 tensor cores on a GPU engine unless
// PrecF32, when RelEps ≥ NewtonTF32MinRelEps; full f32 below, where TF32
// rounding breaks the iteration).
//
// Err (optional, [B] f32) receives per matrix the Newton residual
// δ = ‖X^p·(A + rI) − I‖_F of the returned X, computed with full f32
// products (see RootNewton for the error bound it gives, ResidualFloor
// for its rounding; it costs a few more products), or for RootEigen 0, or
// +Inf for a matrix whose decomposition failed. Status (optional, [B]
// i32) receives 0 for a matrix whose X was written, 1 for one that kept
// the X it had: its decomposition failed or (with Err or Status set) its
// Newton residual was not below ResidualAccept (NaN included). An
// optimizer keeps its previous root and may retry (with F64). Without
// Err and Status, Newton roots are written unchecked.
type InverseRoot struct {
	A, X        *tensor.Tensor
	P           int
	Eps, RelEps float32
	Ridge       *tensor.Tensor
	Method      RootMethod
	Iters       int
	TF32        RootTF32
	F64         bool
	Err         *tensor.Tensor
	Status      *tensor.Tensor
}

// NewtonIters is the default iteration count of RootNewton for the
// inverse p-th root of an n×n matrix with relative ridge relEps: the
// iterates' eigenvalues evolve independently, m ← ((p+1−m)/p)^p·m, from
// M₀'s, which lie in [m, (p+1)/2] with m = (p+1)·relEps/(2(1 + relEps·√n))
// (the ridge is at least relEps·‖A‖_F, and z scales by ‖A + rI‖_F ≤
// ‖A‖_F + r√n); the count is the number of steps this scalar recurrence
// takes to bring both ends of that interval within 1e-6 of 1 (f32's
// accuracy). Without a relative ridge (relEps ≤ 0) it is 40; at most 100.
func NewtonIters(p int, relEps float64, n int) int {
	if relEps <= 0 || p < 1 {
		return 40
	}
	f := func(m float64) float64 {
		return math.Pow(float64(p+1)-m, float64(p)) / math.Pow(float64(p), float64(p)) * m
	}
	lo, hi := float64(p+1)*relEps/(2*(1+relEps*math.Sqrt(float64(n)))), float64(p+1)/2
	k := 0
	for ; k < 100 && (1-lo > 1e-6 || math.Abs(hi-1) > 1e-6); k++ {
		a, b := f(lo), f(hi)
		lo, hi = min(a, b), max(a, b)
	}
	return k
}

// rootGeom is the batch and order of a [n, n] or [B, n, n] tensor.
func rootGeom(what string, t *tensor.Tensor) (batch, n int, err error) {
	switch t.Rank() {
	case 2:
		batch = 1
	case 3:
		batch = t.Dim(0)
	default:
		return 0, 0, fmt.Errorf("%w: %s is %v, want [n, n] or [B, n, n]", tensor.ErrShape, what, t.Shape)
	}
	n = t.Dim(-1)
	if t.Dim(-2) != n || n < 1 || batch < 1 {
		return 0, 0, fmt.Errorf("%w: %s is %v, want square non-empty matrices", tensor.ErrShape, what, t.Shape)
	}
	if err := checkDims(n, n*n, batch); err != nil {
		return 0, 0, err
	}
	return batch, n, nil
}

var f32Only = []tensor.DType{tensor.F32}

// Eigh decomposes a batch of symmetric matrices (see the type). Errors
// wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice,
// exec.ErrCapture (on CUDA inside a capture: see eighSolve), or the
// solver's error (cuSOLVER missing: cuda.ErrNoLibrary).
func (e *Engine) Eigh(d Eigh) error {
	if err := e.checkView("eigh A", d.A, true, f32Only); err != nil {
		return err
	}
	batch, n, err := rootGeom("eigh A", d.A)
	if err != nil {
		return err
	}
	if err := e.checkView("eigh Q", d.Q, true, f32Only, d.A.Shape...); err != nil {
		return err
	}
	wShape := []int{n}
	if d.A.Rank() == 3 {
		wShape = []int{batch, n}
	}
	if err := e.checkView("eigh W", d.W, true, f32Only, wShape...); err != nil {
		return err
	}
	if d.Status != nil {
		if err := e.checkView("eigh Status", d.Status, true, []tensor.DType{tensor.I32}, batch); err != nil {
			return err
		}
	}
	return e.dispatch(func(*hostImpl) error { return hostEigh(d.A, d.Q, d.W, d.Status, batch, n) },
		func(c *cudaImpl) error { return c.eigh(e, d, batch, n) })
}

// InverseRoot computes a batch of inverse p-th roots (see the type).
// Errors wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout,
// exec.ErrDevice, ErrConfig (P < 1, a negative or non-finite ridge, Iters out
// of [0, 1000]), or the solver's error.
func (e *Engine) InverseRoot(r InverseRoot) error {
	if err := e.checkView("inverse root A", r.A, true, f32Only); err != nil {
		return err
	}
	batch, n, err := rootGeom("inverse root A", r.A)
	if err != nil {
		return err
	}
	if err := e.checkView("inverse root X", r.X, true, f32Only, r.A.Shape...); err != nil {
		return err
	}
	for _, t := range []struct {
		what string
		t    *tensor.Tensor
		dt   []tensor.DType
	}{{"Ridge", r.Ridge, f32Only}, {"Err", r.Err, f32Only}, {"Status", r.Status, []tensor.DType{tensor.I32}}} {
		if t.t == nil {
			continue
		}
		if err := e.checkView("inverse root "+t.what, t.t, true, t.dt, batch); err != nil {
			return err
		}
	}
	finite := func(v float32) bool { return !math.IsInf(float64(v), 0) && !math.IsNaN(float64(v)) && v >= 0 }
	if r.P < 1 || r.P > 64 || !finite(r.Eps) || !finite(r.RelEps) || r.Iters < 0 || r.Iters > 1000 || r.TF32 > RootTF32Off {
		return fmt.Errorf("%w: inverse root P %d, Eps %v, RelEps %v, Iters %d, TF32 %d", ErrConfig, r.P, r.Eps, r.RelEps, r.Iters, r.TF32)
	}
	a3, _ := r.A.View(batch, n, n)
	x3, _ := r.X.View(batch, n, n)
	var ridge, errT, statT *tensor.Tensor
	if r.Ridge != nil {
		ridge, _ = r.Ridge.View(batch)
	}
	if r.Err != nil {
		errT, _ = r.Err.View(batch)
	}
	if r.Status != nil {
		statT, _ = r.Status.View(batch)
	}
	// Both methods read the upper triangle only (a statistic accumulated
	// by GEMMs is symmetric only to rounding): a symmetric copy first.
	sym, err := e.ScratchTensor("root.sym", tensor.F32, batch, n, n)
	if err != nil {
		return err
	}
	total := int64(batch) * int64(n) * int64(n)
	if err := e.dispatch(func(*hostImpl) error {
		av, err := hostIn(a3)
		if err != nil {
			return err
		}
		sv, _ := sym.F32()
		nn := n * n
		for i := range sv {
			b, k := i/nn, i%nn
			r, c := k/n, k%n
			if r > c {
				r, c = c, r
			}
			sv[i] = av[b*nn+r*n+c]
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.RootUpper(c, grid1(int(min(total/256+1, 65535))), block1(256), 0, devPtr(a3), devPtr(sym), total, int32(n))
	}); err != nil {
		return err
	}
	g := rootArgs{a: sym, x: x3, batch: batch, n: n, p: r.P, eps: r.Eps, relEps: r.RelEps, ridge: ridge, err: errT, status: statT}
	switch r.Method {
	case RootEigen:
		return e.rootEigen(&g, r.F64)
	case RootNewton:
		iters := r.Iters
		if iters == 0 {
			iters = NewtonIters(r.P, float64(r.RelEps), n)
		}
		full := r.TF32 == RootTF32Off || (r.TF32 == RootTF32Auto && r.RelEps < NewtonTF32MinRelEps)
		return e.rootNewton(&g, iters, full)
	}
	return fmt.Errorf("%w: root method %v", ErrConfig, r.Method)
}

// rootArgs is a validated InverseRoot with [B, n, n] views.
type rootArgs struct {
	a, x        *tensor.Tensor
	batch, n, p int
	eps, relEps float32
	ridge, err  *tensor.Tensor
	status      *tensor.Tensor // optional [B] i32 output
}

// rootChunks is the number of slices each matrix is reduced in
// (root_partials): about 8192 elements each, at most 256.
func rootChunks(n int) int { return min(max((n*n+8191)/8192, 1), 256) }

// rootScalars computes, per matrix, {r, z, z^(1/p), ‖A + rI‖_F} into a
// [B, 4] scratch tensor (slot "root.scal").
func (e *Engine) rootScalars(g *rootArgs) (*tensor.Tensor, error) {
	chunks := rootChunks(g.n)
	part, err := e.ScratchTensor("root.part", tensor.F32, g.batch*chunks*2)
	if err != nil {
		return nil, err
	}
	scal, err := e.ScratchTensor("root.scal", tensor.F32, g.batch, 4)
	if err != nil {
		return nil, err
	}
	if err := e.rootPartials(g.a, part, g.batch, g.n, chunks, 0); err != nil {
		return nil, err
	}
	err = e.dispatch(func(*hostImpl) error {
		pv, _ := part.F32()
		sv, _ := scal.F32()
		var rv []float32
		if g.ridge != nil {
			rv, _ = hostIn(g.ridge)
		}
		for b := 0; b < g.batch; b++ {
			var sq, tr float64
			for c := 0; c < chunks; c++ {
				sq += float64(pv[(b*chunks+c)*2])
				tr += float64(pv[(b*chunks+c)*2+1])
			}
			r := float64(g.eps) + float64(g.relEps)*math.Sqrt(sq)
			if rv != nil {
				r += float64(rv[b])
			}
			nrm := math.Sqrt(math.Max(sq+2*r*tr+float64(g.n)*r*r, 1e-300))
			z := float64(g.p+1) / (2 * nrm)
			sv[b*4], sv[b*4+1], sv[b*4+2], sv[b*4+3] = float32(r), float32(z), float32(math.Pow(z, 1/float64(g.p))), float32(nrm)
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.RootScalars(c, grid1((g.batch+127)/128), block1(128), 0,
			devPtr(part), int32(chunks), int32(g.batch), int32(g.n), int32(g.p), g.eps, g.relEps, devPtr(g.ridge), devPtr(scal))
	})
	return scal, err
}

// rootPartials launches root_partials over a [B, n, n] (host: the same
// sums, in float64, in one chunk's slots per matrix).
func (e *Engine) rootPartials(a, part *tensor.Tensor, batch, n, chunks int, shift float32) error {
	return e.dispatch(func(*hostImpl) error {
		av, err := hostIn(a)
		if err != nil {
			return err
		}
		pv, _ := part.F32()
		clear(pv)
		for b := 0; b < batch; b++ {
			var sq, tr float64
			for i := 0; i < n; i++ {
				for j := 0; j < n; j++ {
					v := float64(av[(b*n+i)*n+j])
					if i == j {
						tr += v
						v -= float64(shift)
					}
					sq += v * v
				}
			}
			pv[b*chunks*2], pv[b*chunks*2+1] = float32(sq), float32(tr)
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.RootPartials(c, [3]uint32{uint32(chunks), uint32(batch), 1}, block1(256), 0,
			devPtr(a), devPtr(part), int32(n), int32(chunks), shift)
	})
}

// rootNewton runs the coupled Newton iteration (RootNewton), its products
// in full f32 when full is set.
func (e *Engine) rootNewton(g *rootArgs, iters int, full bool) error {
	scal, err := e.rootScalars(g)
	if err != nil {
		return err
	}
	shape := []int{g.batch, g.n, g.n}
	var buf [6]*tensor.Tensor
	for i := range buf {
		if buf[i], err = e.ScratchTensor(fmt.Sprintf("root.newton%d", i), tensor.F32, shape...); err != nil {
			return err
		}
	}
	x, xn, m, mn, pool := buf[0], buf[1], buf[2], buf[3], buf[4:]
	total := int64(g.batch) * int64(g.n) * int64(g.n)
	// pool[0] holds T; matPow computes T^p in pool[1] and mn (or returns
	// T itself), and the product T^p·M goes to whichever of the two T^p
	// is not in.
	if err := e.dispatch(func(*hostImpl) error {
		av, err := hostIn(g.a)
		if err != nil {
			return err
		}
		mv, _ := m.F32()
		xv, _ := x.F32()
		sv, _ := scal.F32()
		nn := g.n * g.n
		for i := range mv {
			b, k := i/nn, i%nn
			v := av[i]
			diag := k/g.n == k%g.n
			if diag {
				v += sv[b*4]
			}
			mv[i] = sv[b*4+1] * v
			xv[i] = 0
			if diag {
				xv[i] = sv[b*4+2]
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.RootNewtonInit(c, grid1(int(min(total/256+1, 65535))), block1(256), 0,
			devPtr(g.a), devPtr(m), devPtr(x), devPtr(scal), total, int32(g.n))
	}); err != nil {
		return err
	}
	for k := 0; k < iters; k++ {
		t := pool[0]
		if err := e.rootNewtonT(m, t, total, g.n, g.p); err != nil {
			return err
		}
		if err := e.Matmul(Matmul{A: x, B: t, D: xn, FullF32: full}); err != nil {
			return err
		}
		x, xn = xn, x
		tp, err := e.matPow(t, g.p, pool[1], mn, full)
		if err != nil {
			return err
		}
		// tp is t, pool[1] or mn; the product goes to whichever of
		// pool[1] and mn tp is not (t is dead after it).
		out := mn
		if tp == mn {
			out = pool[1]
		}
		if err := e.Matmul(Matmul{A: tp, B: m, D: out, FullF32: full}); err != nil {
			return err
		}
		if out == pool[1] {
			m, pool[1] = pool[1], m
		} else {
			m, mn = mn, m
		}
	}
	// X is symmetrised into a spare buffer; the residual of that X is
	// measured (A may be X's destination), then X is stored.
	xs := xn
	if err := e.dispatch(func(*hostImpl) error {
		xv, _ := x.F32()
		out, _ := xs.F32()
		nn := g.n * g.n
		for i := range out {
			b, k := i/nn, i%nn
			r, c := k/g.n, k%g.n
			out[i] = 0.5 * (xv[i] + xv[b*nn+c*g.n+r])
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.RootSymmetrize(c, grid1(int(min(total/256+1, 65535))), block1(256), 0,
			devPtr(x), devPtr(xs), total, int32(g.n))
	}); err != nil {
		return err
	}
	if g.err == nil && g.status == nil {
		return e.Copy(g.x, xs)
	}
	errT := g.err
	if errT == nil {
		if errT, err = e.ScratchTensor("root.newton.err", tensor.F32, g.batch); err != nil {
			return err
		}
	}
	if err := e.rootResidual(g, errT, xs, scal, []*tensor.Tensor{x, m, mn, pool[0], pool[1]}); err != nil {
		return err
	}
	// Commit the matrices whose residual is below ResidualAccept (finite).
	status := g.status
	if status == nil {
		if status, err = e.ScratchTensor("root.newton.status", tensor.I32, g.batch); err != nil {
			return err
		}
	}
	if err := e.dispatch(func(*hostImpl) error {
		ev, err := hostIn(errT)
		if err != nil {
			return err
		}
		sv, _ := scal.F32()
		st, err := status.I32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		for b := range st {
			st[b] = 1
			if float64(ev[b]) < ResidualAccept(g.n, float64(sv[b*4]), float64(sv[b*4+3])) {
				st[b] = 0
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.RootErrStatus(c, grid1((g.batch+127)/128), block1(128), 0,
			devPtr(errT), devPtr(scal), int32(g.batch), int32(g.n), devPtr(status))
	}); err != nil {
		return err
	}
	return e.rootCommit(xs, g.x, status, g.batch, g.n*g.n)
}

// rootResidual writes errT[b] = ‖X^p·(A + r_b·I) − I‖_F for the root X
// (the residual of the returned root, which bounds its error: see
// RootNewton), using the five spare buffers.
func (e *Engine) rootResidual(g *rootArgs, errT, x, scal *tensor.Tensor, spare []*tensor.Tensor) error {
	total := int64(g.batch) * int64(g.n) * int64(g.n)
	base := spare[0]
	if err := e.Copy(base, x); err != nil {
		return err
	}
	xp, err := e.matPow(base, g.p, spare[1], spare[2], true)
	if err != nil {
		return err
	}
	y := spare[3]
	if err := e.Matmul(Matmul{A: xp, B: g.a, D: y, FullF32: true}); err != nil {
		return err
	}
	// y += r·X^p, so y = X^p·(A + rI).
	if err := e.dispatch(func(*hostImpl) error {
		yv, _ := y.F32()
		pv, _ := xp.F32()
		sv, _ := scal.F32()
		nn := g.n * g.n
		for i := range yv {
			yv[i] += sv[(i/nn)*4] * pv[i]
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.RootAddRidge(c, grid1(int(min(total/256+1, 65535))), block1(256), 0,
			devPtr(y), devPtr(xp), devPtr(scal), total, int32(g.n))
	}); err != nil {
		return err
	}
	chunks := rootChunks(g.n)
	part, err := e.ScratchTensor("root.part", tensor.F32, g.batch*chunks*2)
	if err != nil {
		return err
	}
	if err := e.rootPartials(y, part, g.batch, g.n, chunks, 1); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		pv, _ := part.F32()
		out, commit, err := hostOut(errT, false)
		if err != nil {
			return err
		}
		for b := range out {
			out[b] = float32(math.Sqrt(float64(pv[b*chunks*2])))
		}
		return commit()
	}, func(c *cudaImpl) error {
		return launch.RootErr(c, grid1((g.batch+127)/128), block1(128), 0,
			devPtr(part), int32(chunks), int32(g.batch), devPtr(errT))
	})
}

// rootNewtonT computes T = ((p+1)I − M)/p.
func (e *Engine) rootNewtonT(m, t *tensor.Tensor, total int64, n, p int) error {
	return e.dispatch(func(*hostImpl) error {
		mv, _ := m.F32()
		tv, _ := t.F32()
		inv := 1 / float32(p)
		nn := n * n
		for i := range tv {
			k := i % nn
			v := -mv[i]
			if k/n == k%n {
				v += float32(p + 1)
			}
			tv[i] = v * inv
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.RootNewtonT(c, grid1(int(min(total/256+1, 65535))), block1(256), 0,
			devPtr(m), devPtr(t), total, int32(n), int32(p))
	})
}

// matPow returns t^p (batched) by repeated squaring, computed in the two
// spare buffers u and v (t itself for p = 1). t may be overwritten. full
// computes the products in full f32 under TF32 (the residual check, whose
// X^p·A − I cancels to well below TF32's resolution: seen on an H100, a
// root accurate to 3e-4 had a TF32 residual of 2.6 and was taken for a
// failure).
func (e *Engine) matPow(t *tensor.Tensor, p int, u, v *tensor.Tensor, full bool) (*tensor.Tensor, error) {
	if p == 1 {
		return t, nil
	}
	// Buffers: base (starts as t), acc (the running product, nil until
	// set). Every product writes a buffer that is neither of its inputs.
	free := []*tensor.Tensor{u, v}
	take := func(not ...*tensor.Tensor) *tensor.Tensor {
		for _, f := range append(free, t) {
			busy := false
			for _, x := range not {
				busy = busy || f == x
			}
			if !busy {
				return f
			}
		}
		return nil
	}
	base := t
	var acc *tensor.Tensor
	for q := p; q > 0; q >>= 1 {
		if q&1 == 1 {
			if acc == nil {
				acc = base
			} else {
				out := take(acc, base)
				if err := e.Matmul(Matmul{A: acc, B: base, D: out, FullF32: full}); err != nil {
					return nil, err
				}
				acc = out
			}
		}
		if q > 1 {
			out := take(acc, base)
			if err := e.Matmul(Matmul{A: base, B: base, D: out, FullF32: full}); err != nil {
				return nil, err
			}
			base = out
		}
	}
	return acc, nil
}

// rootEigen assembles roots from Eigh (RootEigen).
func (e *Engine) rootEigen(g *rootArgs, f64 bool) error {
	scal, err := e.rootScalars(g)
	if err != nil {
		return err
	}
	shape := []int{g.batch, g.n, g.n}
	q, err := e.ScratchTensor("root.eig.q", tensor.F32, shape...)
	if err != nil {
		return err
	}
	w, err := e.ScratchTensor("root.eig.w", tensor.F32, g.batch, g.n)
	if err != nil {
		return err
	}
	status := g.status
	if status == nil {
		if status, err = e.ScratchTensor("root.eig.status", tensor.I32, g.batch); err != nil {
			return err
		}
	}
	if err := e.Eigh(Eigh{A: g.a, Q: q, W: w, F64: f64, Status: status}); err != nil {
		return err
	}
	s, err := e.ScratchTensor("root.eig.s", tensor.F32, shape...)
	if err != nil {
		return err
	}
	expo := float32(-1 / float64(g.p))
	total := int64(g.batch) * int64(g.n) * int64(g.n)
	if err := e.dispatch(func(*hostImpl) error {
		qv, _ := q.F32()
		wv, _ := w.F32()
		sv, _ := scal.F32()
		ss, _ := s.F32()
		nn := g.n * g.n
		for i := range ss {
			b, row := i/nn, (i%nn)/g.n
			lam := float64(max(wv[b*g.n+row], 0)) + float64(sv[b*4])
			ss[i] = float32(math.Pow(lam, float64(expo))) * qv[i]
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.RootEigScale(c, grid1(int(min(total/256+1, 65535))), block1(256), 0,
			devPtr(q), devPtr(w), devPtr(scal), devPtr(s), total, int32(g.n), expo)
	}); err != nil {
		return err
	}
	// X = Qᵀ·S, into a scratch matrix committed where the decomposition
	// succeeded.
	xt, err := e.ScratchTensor("root.newton0", tensor.F32, shape...)
	if err != nil {
		return err
	}
	if err := e.Matmul(Matmul{A: q, B: s, D: xt, TransA: true}); err != nil {
		return err
	}
	if g.err != nil {
		if err := e.dispatch(func(*hostImpl) error {
			st, _ := status.I32()
			out, commit, err := hostOut(g.err, false)
			if err != nil {
				return err
			}
			for b := range out {
				out[b] = 0
				if st[b] != 0 {
					out[b] = float32(math.Inf(1))
				}
			}
			return commit()
		}, func(c *cudaImpl) error {
			return launch.RootStatusErr(c, grid1((g.batch+127)/128), block1(128), 0,
				devPtr(status), int32(g.batch), devPtr(g.err))
		}); err != nil {
			return err
		}
	}
	return e.rootCommit(xt, g.x, status, g.batch, g.n*g.n)
}

// rootCommit copies src's matrices (per elements each) into dst where
// status is 0.
func (e *Engine) rootCommit(src, dst, status *tensor.Tensor, batch, per int) error {
	total := int64(batch) * int64(per)
	return e.dispatch(func(*hostImpl) error {
		sv, err := hostIn(src)
		if err != nil {
			return err
		}
		st, _ := status.I32()
		dv, err := dst.ReadFloat32()
		if err != nil {
			return err
		}
		for i := range dv {
			if st[i/per] == 0 {
				dv[i] = sv[i]
			}
		}
		return dst.WriteFloat32(dv)
	}, func(c *cudaImpl) error {
		return launch.RootCommit(c, grid1(int(min(total/256+1, 65535))), block1(256), 0,
			devPtr(src), devPtr(dst), devPtr(status), total, int64(per))
	})
}

// hostEigh decomposes each matrix in float64 with gonum's EigenSym, from
// the upper triangle; a failed one keeps Q and W and gets status 1.
func hostEigh(a, q, w, status *tensor.Tensor, batch, n int) error {
	av, err := hostIn(a)
	if err != nil {
		return err
	}
	qv, err := q.ReadFloat32()
	if err != nil {
		return err
	}
	wv, err := w.ReadFloat32()
	if err != nil {
		return err
	}
	var st []int32
	if status != nil {
		if st, err = status.I32(); err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
	}
	sym := mat.NewSymDense(n, nil)
	var vecs mat.Dense
	var es mat.EigenSym
	for b := 0; b < batch; b++ {
		ab := av[b*n*n : (b+1)*n*n]
		finite := true
		for i := 0; i < n; i++ {
			for j := i; j < n; j++ {
				v := float64(ab[i*n+j])
				finite = finite && !math.IsNaN(v) && !math.IsInf(v, 0)
				sym.SetSym(i, j, v)
			}
		}
		ok := finite && es.Factorize(sym, true)
		var vals []float64
		if ok {
			vals = es.Values(nil)
			es.VectorsTo(&vecs)
			for _, v := range vals {
				ok = ok && !math.IsNaN(v) && !math.IsInf(v, 0)
			}
		}
		if st != nil {
			st[b] = 0
			if !ok {
				st[b] = 1
			}
		}
		if !ok {
			continue
		}
		for j := 0; j < n; j++ {
			wv[b*n+j] = float32(vals[j])
			for i := 0; i < n; i++ {
				qv[(b*n+j)*n+i] = float32(vecs.At(i, j)) // row j of Q: eigenvector j
			}
		}
	}
	if err := w.WriteFloat32(wv); err != nil {
		return err
	}
	return q.WriteFloat32(qv)
}

// eighState is the eigensolver's choice on this engine: noBatched, when
// the cuSOLVER library has no batched solver (or a benchmark asked for one
// syevd per matrix).
type eighState struct{ noBatched bool }

// eighSolve decomposes batch n×n matrices at work in place (eigenvalues
// into wv, statuses into info): with cuSOLVER's batched solver
// (cusolverDnXsyevBatched, CUDA 12.6+) in as few calls as its size limit
// allows, else one syevd per matrix.
//
// Not inside a capture (exec.ErrCapture): both solvers take a host
// workspace and do part of the decomposition on the host, so a graph
// would keep what the host computed at capture time (on a GPU machine,
// 2026-11-28, Shampoo's refreshes replayed from graphs holding syevd gave
// other losses than the same refreshes run eagerly).
func (c *cudaImpl) eighSolve(dt cuda.DataType, size int64, batch, n int, work, wv, info cuda.DevicePtr) error {
	if on, err := c.Stream().IsCapturing(); err != nil || on {
		if err == nil {
			err = errors.New("cuSOLVER's eigensolvers work partly on the host and cannot be captured")
		}
		return fmt.Errorf("ops: eigh: %w: %w", exec.ErrCapture, err)
	}
	solver, err := c.Solver()
	if err != nil {
		return fmt.Errorf("ops: eigh: %w", err)
	}
	st := exec.StateOf[eighState](c.CUDA)
	nn := int64(n) * int64(n)
	if batch > 1 && !st.noBatched {
		per := int(min(int64(batch), (1<<31-1)/nn))
		ws, err := solver.SyevBatchedBufferSize(dt, n, n, per, work, wv)
		switch {
		case errors.Is(err, cuda.ErrNoSymbol):
			st.noBatched = true
		case err != nil:
			return fmt.Errorf("ops: eigh: %w", err)
		default:
			buf, err := c.Scratch("eigh.ws", max(ws, 1))
			if err != nil {
				return err
			}
			for b0 := 0; b0 < batch; b0 += per {
				k := min(per, batch-b0)
				if err := solver.SyevBatched(c.Stream(), dt, n, n, k, work.Add(int64(b0)*nn*size), wv.Add(int64(b0)*int64(n)*size),
					buf, ws, info.Add(int64(b0)*4)); err != nil {
					return fmt.Errorf("ops: eigh of %d matrices (n = %d): %w", k, n, err)
				}
			}
			return nil
		}
	}
	lwork, err := solver.SyevdBufferSize(dt, n, n, work, wv)
	if err != nil {
		return fmt.Errorf("ops: eigh: %w", err)
	}
	if err := c.solverLanes("eigh.ws", batch, int64(max(lwork, 1))*size, func(solver *cuda.SolverHandle, b int64, ws cuda.DevicePtr) error {
		return solver.Syevd(c.Stream(), dt, n, n, work.Add(b*nn*size), wv.Add(b*int64(n)*size), ws, lwork, info.Add(b*4))
	}); err != nil {
		return fmt.Errorf("ops: eigh (n = %d): %w", n, err)
	}
	return nil
}

// eigh runs cuSOLVER's eigensolver (eighSolve) on a scratch copy (f32, or
// widened to f64), then commits the matrices whose decomposition succeeded.
func (c *cudaImpl) eigh(e *Engine, d Eigh, batch, n int) error {
	dt, size := cuda.R32F, int64(4)
	if d.F64 {
		dt, size = cuda.R64F, 8
	}
	nn := int64(n) * int64(n)
	total := int64(batch) * nn
	work, err := c.Scratch("eigh.work", total*size)
	if err != nil {
		return err
	}
	wv, err := c.Scratch("eigh.w", int64(batch)*int64(n)*size)
	if err != nil {
		return err
	}
	info, err := c.Scratch("eigh.info", int64(batch)*4)
	if err != nil {
		return err
	}
	if d.F64 {
		if err := launch.RootWiden(c, grid1(int(min(total/256+1, 65535))), block1(256), 0, devPtr(d.A), work, total); err != nil {
			return err
		}
	} else if err := cuda.MemcpyDtoDAsync(work, devPtr(d.A), total*4, c.Stream()); err != nil {
		return err
	}
	if err := c.eighSolve(dt, size, batch, n, work, wv, info); err != nil {
		return err
	}
	qf, wf := work, wv
	if d.F64 {
		if qf, err = c.Scratch("eigh.qf", total*4); err != nil {
			return err
		}
		if wf, err = c.Scratch("eigh.wf", int64(batch)*int64(n)*4); err != nil {
			return err
		}
		for _, p := range []struct {
			src, dst cuda.DevicePtr
			cnt      int64
		}{{work, qf, total}, {wv, wf, int64(batch) * int64(n)}} {
			if err := launch.RootNarrow(c, grid1(int(min(p.cnt/256+1, 65535))), block1(256), 0, p.src, p.dst, p.cnt); err != nil {
				return err
			}
		}
	}
	status := devPtr(d.Status)
	if status == 0 {
		if status, err = c.Scratch("eigh.status", int64(batch)*4); err != nil {
			return err
		}
	}
	if err := launch.RootEigStatus(c, grid1((batch+127)/128), block1(128), 0,
		info, wf, int32(n), int32(batch), status, 0); err != nil {
		return err
	}
	for _, p := range []struct {
		src, dst cuda.DevicePtr
		per      int64
	}{{qf, devPtr(d.Q), nn}, {wf, devPtr(d.W), int64(n)}} {
		cnt := int64(batch) * p.per
		if err := launch.RootCommit(c, grid1(int(min(cnt/256+1, 65535))), block1(256), 0,
			p.src, p.dst, status, cnt, p.per); err != nil {
			return err
		}
	}
	return nil
}
