package opstest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"gonum.org/v1/gonum/mat"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "matroot", Check: checkMatroot}) }

// RefSym is the symmetric n×n matrix whose upper triangle (row-major,
// j ≥ i) is a's, in float64: what Eigh and InverseRoot read.
func RefSym(a []float64, n int) *mat.SymDense {
	s := mat.NewSymDense(n, nil)
	for i := 0; i < n; i++ {
		for j := i; j < n; j++ {
			s.SetSym(i, j, a[i*n+j])
		}
	}
	return s
}

// RefEigh is the float64 eigendecomposition of RefSym(a, n): ascending
// eigenvalues and the eigenvectors as the columns of v (row-major n×n).
func RefEigh(a []float64, n int) (w, v []float64) {
	var es mat.EigenSym
	if !es.Factorize(RefSym(a, n), true) {
		panic("opstest: reference eigendecomposition failed")
	}
	var vecs mat.Dense
	es.VectorsTo(&vecs)
	v = make([]float64, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			v[i*n+j] = vecs.At(i, j)
		}
	}
	return es.Values(nil), v
}

// RefInverseRoot is (S + r·I)^(−1/p) for S = RefSym(a, n) in float64, with
// negative eigenvalues of S clamped to 0 before the ridge r is added (the
// definition ops.InverseRoot computes).
func RefInverseRoot(a []float64, n, p int, r float64) []float64 {
	w, v := RefEigh(a, n)
	x := make([]float64, n*n)
	for k := 0; k < n; k++ {
		f := math.Pow(math.Max(w[k], 0)+r, -1/float64(p))
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				x[i*n+j] += v[i*n+k] * f * v[j*n+k]
			}
		}
	}
	return x
}

// RandOrth is a random n×n orthogonal matrix, row-major: Gram–Schmidt
// on the columns of a Gaussian matrix.
func RandOrth(r *rand.Rand, n int) []float64 {
	q := make([]float64, n*n)
	for i := range q {
		q[i] = r.NormFloat64()
	}
	for j := 0; j < n; j++ {
		for k := 0; k < j; k++ {
			var d float64
			for i := 0; i < n; i++ {
				d += q[i*n+j] * q[i*n+k]
			}
			for i := 0; i < n; i++ {
				q[i*n+j] -= d * q[i*n+k]
			}
		}
		var s float64
		for i := 0; i < n; i++ {
			s += q[i*n+j] * q[i*n+j]
		}
		for i := 0; i < n; i++ {
			q[i*n+j] /= math.Sqrt(s)
		}
	}
	return q
}

// RandSPD is Q·diag(λ)·Qᵀ for a random orthogonal Q (Gram–Schmidt of
// Gaussian columns) and eigenvalues log-uniform in [scale/cond, scale]:
// a symmetric positive definite matrix of condition number about cond.
func RandSPD(r *rand.Rand, n int, cond, scale float64) []float64 {
	q := RandOrth(r, n)
	a := make([]float64, n*n)
	for k := 0; k < n; k++ {
		lam := scale * math.Pow(cond, -r.Float64())
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				a[i*n+j] += q[i*n+k] * lam * q[j*n+k]
			}
		}
	}
	return a
}

func checkMatroot(s *Suite) {
	for _, n := range []int{1, 6, 33} {
		for _, batch := range []int{0, 3} {
			for _, f64 := range []bool{false, true} {
				s.Run(fmt.Sprintf("eigh/n=%d/batch=%d/f64=%v", n, batch, f64), func(s *Suite) { eighCheck(s, n, batch, f64) })
			}
		}
	}
	s.Run("eigh/failure", eighFailure)
	for _, m := range []ops.RootMethod{ops.RootEigen, ops.RootNewton} {
		for _, p := range []int{1, 2, 4} {
			for _, n := range []int{1, 6, 33} {
				s.Run(fmt.Sprintf("root/%v/p=%d/n=%d", m, p, n), func(s *Suite) { rootCheck(s, m, p, n) })
			}
		}
		s.Run(fmt.Sprintf("root/%v/ridge-tensor+in-place", m), func(s *Suite) { rootRidge(s, m) })
		s.Run(fmt.Sprintf("root/%v/upper-triangle", m), func(s *Suite) { rootUpper(s, m) })
	}
	s.Run("root/newton/rank-deficient", rootRankDeficient)
	s.Run("root/eigen/failure", func(s *Suite) { rootFailure(s, ops.RootEigen) })
	s.Run("root/newton/failure", func(s *Suite) { rootFailure(s, ops.RootNewton) })
	s.Run("validation", matrootValidation)
}

// eighTol is the accuracy asked of Eigh relative to ‖A‖: a backward-stable
// f32 eigensolver is good to a small multiple of n·2⁻²⁴ (f64: the f32
// rounding of the results).
func eighTol(n int, f64 bool) float64 {
	if f64 {
		return 1e-6
	}
	return 2e-7 * float64(n+8)
}

func eighCheck(s *Suite, n, batch int, f64 bool) {
	nb := max(batch, 1)
	shape := withBatch(batch, []int{n, n})
	// Symmetric indefinite matrices, with garbage below the diagonal:
	// only the upper triangle is read.
	av := make([]float64, nb*n*n)
	for i := range av {
		av[i] = s.R.NormFloat64()
	}
	a := s.Const(tensor.F32, av, shape...)
	av = s.Read(a)
	q := s.Empty(tensor.F32, shape...)
	w := s.Empty(tensor.F32, withBatch(batch, []int{n})...)
	st := s.Empty(tensor.I32, nb)
	s.NoErr("eigh", s.E.Eigh(ops.Eigh{A: a, Q: q, W: w, F64: f64, Status: st}))
	qv, wv, stv := s.Read(q), s.Read(w), readI32(s, st)
	tol := eighTol(n, f64)
	for b := 0; b < nb; b++ {
		if stv[b] != 0 {
			s.T.Errorf("matrix %d: status %d", b, stv[b])
		}
		ab := av[b*n*n : (b+1)*n*n]
		ref, _ := RefEigh(ab, n)
		sym := RefSym(ab, n)
		anorm := mat.Norm(sym, 2)
		wb, qb := wv[b*n:(b+1)*n], qv[b*n*n:(b+1)*n*n]
		if !sort.Float64sAreSorted(wb) {
			s.T.Errorf("matrix %d: eigenvalues not ascending: %v", b, wb)
		}
		for i := range ref {
			if math.Abs(wb[i]-ref[i]) > tol*anorm {
				s.T.Errorf("matrix %d: λ[%d] = %v, want %v", b, i, wb[i], ref[i])
				break
			}
		}
		// ‖Qᵀ·diag(W)·Q − S‖_F and ‖Q·Qᵀ − I‖_F.
		var rec, orth float64
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				var x, o float64
				for k := 0; k < n; k++ {
					x += qb[k*n+i] * wb[k] * qb[k*n+j]
					o += qb[i*n+k] * qb[j*n+k]
				}
				rec += (x - sym.At(i, j)) * (x - sym.At(i, j))
				if i == j {
					o--
				}
				orth += o * o
			}
		}
		if math.Sqrt(rec) > tol*anorm*math.Sqrt(float64(n)) || math.Sqrt(orth) > tol*math.Sqrt(float64(n)) {
			s.T.Errorf("matrix %d: ‖QᵀWQ − A‖_F = %.3g, ‖QQᵀ − I‖_F = %.3g (‖A‖₂ %.3g, tol %.3g)", b, math.Sqrt(rec), math.Sqrt(orth), anorm, tol)
		}
	}
}

// readI32 reads an i32 tensor on any device.
func readI32(s *Suite, t *tensor.Tensor) []int32 {
	s.T.Helper()
	s.NoErr("sync", s.E.Sync())
	b, err := t.Read()
	s.NoErr("read", err)
	return tensor.BytesAs[int32](b)
}

// eighFailure: a matrix with a NaN fails (status 1) and keeps its Q and W;
// the others are decomposed.
func eighFailure(s *Suite) {
	const n, batch = 5, 3
	av := make([]float64, batch*n*n)
	for b := 0; b < batch; b++ {
		copy(av[b*n*n:], RandSPD(s.R, n, 10, 1))
	}
	av[n*n+2] = math.NaN()
	a := s.Const(tensor.F32, av, batch, n, n)
	keepQ, keepW := make([]float64, batch*n*n), make([]float64, batch*n)
	for i := range keepQ {
		keepQ[i] = 7
	}
	for i := range keepW {
		keepW[i] = -3
	}
	q := s.Const(tensor.F32, keepQ, batch, n, n)
	w := s.Const(tensor.F32, keepW, batch, n)
	st := s.Empty(tensor.I32, batch)
	s.NoErr("eigh", s.E.Eigh(ops.Eigh{A: a, Q: q, W: w, Status: st}))
	if got := readI32(s, st); got[0] != 0 || got[1] != 1 || got[2] != 0 {
		s.T.Errorf("status %v, want [0 1 0]", got)
	}
	qv, wv := s.Read(q), s.Read(w)
	for i := n * n; i < 2*n*n; i++ {
		if qv[i] != 7 {
			s.T.Fatalf("failed matrix's Q changed: %v", qv[n*n:2*n*n])
		}
	}
	for i := n; i < 2*n; i++ {
		if wv[i] != -3 {
			s.T.Fatalf("failed matrix's W changed: %v", wv[n:2*n])
		}
	}
	if wv[0] == -3 || wv[2*n] == -3 {
		s.T.Errorf("good matrices not decomposed: W %v", wv)
	}
}

// rootTol is the accuracy asked of an inverse root relative to the
// reference: the f32 eigensolver's error grows with the condition number
// (RandSPD's 100 here), the assembly and Newton GEMMs add GemmTol each
// (TF32 on a GPU engine).
func rootTol(s *Suite) float64 { return 20*s.GemmTol(tensor.F32) + 2e-4 }

func rootCheck(s *Suite, m ops.RootMethod, p, n int) {
	const batch, cond, relEps, eps = 3, 100, 1e-3, 1e-4
	av := make([]float64, batch*n*n)
	for b := 0; b < batch; b++ {
		copy(av[b*n*n:], RandSPD(s.R, n, cond, math.Pow(10, float64(b)-1)))
	}
	a := s.Const(tensor.F32, av, batch, n, n)
	av = s.Read(a)
	x := s.Empty(tensor.F32, batch, n, n)
	errT := s.Empty(tensor.F32, batch)
	s.NoErr("inverse root", s.E.InverseRoot(ops.InverseRoot{A: a, X: x, P: p, Eps: eps, RelEps: relEps, Method: m, Err: errT}))
	xv, ev := s.Read(x), s.Read(errT)
	tol := rootTol(s)
	for b := 0; b < batch; b++ {
		ab := av[b*n*n : (b+1)*n*n]
		r := eps + relEps*mat.Norm(RefSym(ab, n), 2) // Frobenius
		want := RefInverseRoot(ab, n, p, r)
		got := xv[b*n*n : (b+1)*n*n]
		e := TermsErr(got, want, nil) // a matrix function: relative to itself
		switch m {
		case ops.RootEigen:
			if ev[b] != 0 {
				s.T.Errorf("matrix %d: Err %v, want 0", b, ev[b])
			}
			if !(e <= tol) {
				s.T.Errorf("matrix %d: relative error %.3g > %.3g", b, e, tol)
			}
		case ops.RootNewton:
			// The stated bound δ/(p(1−δ)) for the reported residual δ
			// (with a little slack for the f32 rounding of δ itself and
			// of the comparison), and a small error.
			d := ev[b]
			bound := 1.01*d/(float64(p)*(1-d)) + 1e-6
			if !(d < 0.5) || !(e <= bound) || !(e <= tol) {
				s.T.Errorf("matrix %d: relative error %.3g, residual δ = %.3g, bound δ/(p(1−δ)) = %.3g", b, e, d, bound)
			}
		}
	}
}

// rootRidge: a per-matrix Ridge tensor adds to the ridge, and X may be A.
func rootRidge(s *Suite, m ops.RootMethod) {
	const batch, n, p = 2, 9, 2
	av := make([]float64, batch*n*n)
	for b := 0; b < batch; b++ {
		copy(av[b*n*n:], RandSPD(s.R, n, 1e4, 1))
	}
	a := s.Const(tensor.F32, av, batch, n, n)
	av = s.Read(a)
	rv := []float64{0.5, 0.01}
	ridge := s.Const(tensor.F32, rv, batch)
	s.NoErr("inverse root", s.E.InverseRoot(ops.InverseRoot{A: a, X: a, P: p, Eps: 0.25, Ridge: ridge, Method: m}))
	xv := s.Read(a)
	for b := range rv {
		r := 0.25 + float64(float32(rv[b]))
		want := RefInverseRoot(av[b*n*n:(b+1)*n*n], n, p, r)
		s.Close(fmt.Sprintf("matrix %d in place", b), xv[b*n*n:(b+1)*n*n], want, nil, rootTol(s))
	}
}

// rootUpper: only the upper triangle is read (the lower one here is noise).
func rootUpper(s *Suite, m ops.RootMethod) {
	const n, p = 7, 2
	av := RandSPD(s.R, n, 20, 1)
	for i := 0; i < n; i++ {
		for j := 0; j < i; j++ {
			av[i*n+j] += 0.5 * s.R.NormFloat64()
		}
	}
	a := s.Const(tensor.F32, av, n, n)
	av = s.Read(a)
	x := s.Empty(tensor.F32, n, n)
	s.NoErr("inverse root", s.E.InverseRoot(ops.InverseRoot{A: a, X: x, P: p, Eps: 0.01, Method: m}))
	s.Close("X", s.Read(x), RefInverseRoot(av, n, p, float64(float32(0.01))), nil, rootTol(s))
}

// rootRankDeficient: Shampoo's first statistics — GᵀG/k of a Gaussian
// k×n block with k < n, rank k — at Shampoo's default ridge 1e-6·‖A‖_F,
// where the condition number is 10⁶: the Newton roots (full f32 products
// on any engine: the ridge is below ops.NewtonTF32MinRelEps) are
// accurate, and they are accepted (Status 0) although their residual δ,
// computed in f32, sits near its rounding floor ops.ResidualFloor (an f32
// emulation put δ near 1 at these orders: under the old acceptance, δ < 1,
// such roots were discarded).
func rootRankDeficient(s *Suite) {
	const batch, k, n, p, relEps = 2, 40, 96, 4, 1e-6
	g := make([]float64, batch*k*n)
	for i := range g {
		g[i] = s.R.NormFloat64()
	}
	av := make([]float64, 0, batch*n*n)
	for b := 0; b < batch; b++ {
		ab := RefMatmul(g[b*k*n:(b+1)*k*n], g[b*k*n:(b+1)*k*n], n, n, k, true, false)
		for i := range ab {
			ab[i] /= k
		}
		av = append(av, ab...)
	}
	a := s.Const(tensor.F32, av, batch, n, n)
	av = s.Read(a)
	x := s.Empty(tensor.F32, batch, n, n)
	errT := s.Empty(tensor.F32, batch)
	st := s.Empty(tensor.I32, batch)
	s.NoErr("inverse root", s.E.InverseRoot(ops.InverseRoot{A: a, X: x, P: p, RelEps: relEps, Method: ops.RootNewton, Err: errT, Status: st}))
	xv, ev, sv := s.Read(x), s.Read(errT), readI32(s, st)
	for b := 0; b < batch; b++ {
		ab := av[b*n*n : (b+1)*n*n]
		nrmA := mat.Norm(RefSym(ab, n), 2)
		r := relEps * nrmA
		want := RefInverseRoot(ab, n, p, r)
		e := TermsErr(xv[b*n*n:(b+1)*n*n], want, nil)
		// ‖A + rI‖_F ≈ ‖A‖_F: the floor and the acceptance it gives.
		floor, accept := ops.ResidualFloor(n, r, nrmA), ops.ResidualAccept(n, r, nrmA)
		s.T.Logf("matrix %d: relative error %.3g, δ %.3g (floor %.3g, accepted below %.3g), status %d", b, e, ev[b], floor, accept, sv[b])
		if sv[b] != 0 || !(ev[b] < accept) {
			s.T.Errorf("matrix %d: status %d, δ %.3g: an accurate root (error %.3g) was rejected", b, sv[b], ev[b], e)
		}
		if !(e <= 1e-2) {
			s.T.Errorf("matrix %d: relative error %.3g > 1e-2", b, e)
		}
	}
}

// rootFailure: a matrix with a NaN keeps its previous root and reports
// Err = +Inf (eigen) or a residual not below 1 (Newton: NaN); the others
// are computed.
func rootFailure(s *Suite, m ops.RootMethod) {
	const n, batch = 4, 2
	av := append(RandSPD(s.R, n, 10, 1), RandSPD(s.R, n, 10, 1)...)
	av[n*n+5] = math.NaN()
	a := s.Const(tensor.F32, av, batch, n, n)
	old := make([]float64, batch*n*n)
	for i := range old {
		old[i] = 0.5
	}
	x := s.Const(tensor.F32, old, batch, n, n)
	errT := s.Empty(tensor.F32, batch)
	st := s.Empty(tensor.I32, batch)
	s.NoErr("inverse root", s.E.InverseRoot(ops.InverseRoot{A: a, X: x, P: 4, Eps: 1e-3, Method: m, Err: errT, Status: st}))
	ev, xv := s.Read(errT), s.Read(x)
	if !(ev[0] < 1e-2) || ev[1] < 1 {
		s.T.Errorf("Err %v, want [small, not below 1]", ev)
	}
	if sv := readI32(s, st); sv[0] != 0 || sv[1] != 1 {
		s.T.Errorf("Status %v, want [0 1]", sv)
	}
	if m == ops.RootEigen && !math.IsInf(ev[1], 1) {
		s.T.Errorf("Err %v, want [0 +Inf]", ev)
	}
	for i := n * n; i < 2*n*n; i++ {
		if xv[i] != 0.5 {
			s.T.Fatalf("failed matrix's root changed: %v", xv[n*n:])
		}
	}
	s.Close("good matrix", xv[:n*n], RefInverseRoot(s.Read(a)[:n*n], n, 4, 1e-3), nil, rootTol(s))
}

func matrootValidation(s *Suite) {
	sq := s.Empty(tensor.F32, 2, 4, 4)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"non-square", s.E.InverseRoot(ops.InverseRoot{A: s.Empty(tensor.F32, 3, 4), X: s.Empty(tensor.F32, 3, 4), P: 2}), tensor.ErrShape},
		{"bf16", s.E.InverseRoot(ops.InverseRoot{A: s.Empty(tensor.BF16, 4, 4), X: s.Empty(tensor.BF16, 4, 4), P: 2}), tensor.ErrDType},
		{"X shape", s.E.InverseRoot(ops.InverseRoot{A: sq, X: s.Empty(tensor.F32, 4, 4), P: 2}), tensor.ErrShape},
		{"P 0", s.E.InverseRoot(ops.InverseRoot{A: sq, X: sq, P: 0}), ops.ErrConfig},
		{"negative Eps", s.E.InverseRoot(ops.InverseRoot{A: sq, X: sq, P: 2, Eps: -1}), ops.ErrConfig},
		{"Ridge shape", s.E.InverseRoot(ops.InverseRoot{A: sq, X: sq, P: 2, Ridge: s.Empty(tensor.F32, 3)}), tensor.ErrShape},
		{"method", s.E.InverseRoot(ops.InverseRoot{A: sq, X: sq, P: 2, Method: 9}), ops.ErrConfig},
		{"TF32 mode", s.E.InverseRoot(ops.InverseRoot{A: sq, X: sq, P: 2, TF32: 7}), ops.ErrConfig},
		{"Status dtype", s.E.InverseRoot(ops.InverseRoot{A: sq, X: sq, P: 2, Status: s.Empty(tensor.F32, 2)}), tensor.ErrDType},
		{"eigh W shape", s.E.Eigh(ops.Eigh{A: sq, Q: sq, W: s.Empty(tensor.F32, 4)}), tensor.ErrShape},
		{"eigh Status dtype", s.E.Eigh(ops.Eigh{A: sq, Q: sq, W: s.Empty(tensor.F32, 2, 4), Status: s.Empty(tensor.F32, 2)}), tensor.ErrDType},
		{"rank 4", s.E.Eigh(ops.Eigh{A: s.Empty(tensor.F32, 1, 2, 4, 4), Q: s.Empty(tensor.F32, 1, 2, 4, 4), W: s.Empty(tensor.F32, 2, 4)}), tensor.ErrShape},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			s.T.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
}
