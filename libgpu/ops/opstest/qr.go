package opstest

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "qr", Check: checkQR}) }

// RefQRRows orthonormalises the rows of a (row-major n×n, full rank) in
// order in float64 by Gram–Schmidt with reorthogonalisation: the Q of
// ops.QR (A = Lo·Q, Lo lower triangular with a positive diagonal), and
// Lo's diagonal (each row's norm after the earlier rows are removed).
func RefQRRows(a []float64, n int) (q, diag []float64) {
	q = make([]float64, n*n)
	diag = make([]float64, n)
	for i := 0; i < n; i++ {
		row := append([]float64(nil), a[i*n:(i+1)*n]...)
		for pass := 0; pass < 2; pass++ {
			for k := 0; k < i; k++ {
				var d float64
				for j := 0; j < n; j++ {
					d += row[j] * q[k*n+j]
				}
				for j := 0; j < n; j++ {
					row[j] -= d * q[k*n+j]
				}
			}
		}
		var s float64
		for _, v := range row {
			s += v * v
		}
		s = math.Sqrt(s)
		diag[i] = s
		for j := 0; j < n; j++ {
			q[i*n+j] = row[j] / s
		}
	}
	return q, diag
}

// RefSOAPBasis is SOAP's power-iteration refresh (ops.SOAPBasis) of the
// orthonormal rows q (n×n) for symmetric s, in float64: the stable
// ascending order perm of the estimates q_i·s·q_iᵀ, and the new basis
// (row k refines old row perm[k]); also Lo's diagonal of the descending
// orthonormalisation, in ascending order (row k's: how well it is
// determined).
func RefSOAPBasis(s, q []float64, n int) (out []float64, perm []int, diag []float64) {
	est := make([]float64, n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			var acc float64
			for k := 0; k < n; k++ {
				acc += q[i*n+k] * s[k*n+j]
			}
			est[i] += acc * q[i*n+j]
		}
	}
	perm = make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	sort.SliceStable(perm, func(x, y int) bool { return est[perm[x]] < est[perm[y]] })
	out, diag = RefSOAPBasisPerm(s, q, perm, n)
	return out, perm, diag
}

// RefSOAPBasisPerm is RefSOAPBasis with the order given: the rows q_i·s
// orthonormalised in descending order of perm (perm[n−1] first), returned
// ascending (row k refines old row perm[k]) with Lo's diagonal in that
// order.
func RefSOAPBasisPerm(s, q []float64, perm []int, n int) (out, diag []float64) {
	g := make([]float64, n*n)
	for k := 0; k < n; k++ {
		src := perm[n-1-k]
		for j := 0; j < n; j++ {
			for x := 0; x < n; x++ {
				g[k*n+j] += q[src*n+x] * s[x*n+j]
			}
		}
	}
	qr, d := RefQRRows(g, n)
	out = make([]float64, n*n)
	diag = make([]float64, n)
	for k := 0; k < n; k++ {
		copy(out[k*n:(k+1)*n], qr[(n-1-k)*n:(n-k)*n])
		diag[k] = d[n-1-k]
	}
	return out, diag
}

func checkQR(s *Suite) {
	for _, n := range []int{1, 6, 33} {
		for _, batch := range []int{0, 3} {
			for _, f64 := range []bool{false, true} {
				s.Run(fmt.Sprintf("qr/n=%d/batch=%d/f64=%v", n, batch, f64), func(s *Suite) { qrCheck(s, n, batch, f64, false) })
			}
		}
	}
	s.Run("qr/in-place", func(s *Suite) { qrCheck(s, 17, 2, false, true) })
	s.Run("qr/failure", qrFailure)
	for _, n := range []int{1, 7, 40} {
		s.Run(fmt.Sprintf("soap-basis/n=%d", n), func(s *Suite) { soapBasisCheck(s, n) })
	}
	s.Run("soap-basis/converges", soapBasisConverges)
	s.Run("soap-basis/failure", soapBasisFailure)
	s.Run("soap-permute", soapPermuteCheck)
	s.Run("soap-permute/consistent", soapPermuteConsistent)
	s.Run("validation", qrValidation)
}

// qrTol is QR's accuracy on the well-conditioned matrices of the checks
// (condition number below about 3): f32 rounding times a small multiple
// of n, the float64 path's f32 storage alone.
func qrTol(n int, f64 bool) float64 {
	if f64 {
		return 1e-6
	}
	return 2e-7 * float64(n+8)
}

// wellCond is a well-conditioned n×n matrix: 2·I + G/(2√n), G Gaussian.
func wellCond(s *Suite, n int) []float64 {
	a := make([]float64, n*n)
	for i := range a {
		a[i] = s.R.NormFloat64() / (2 * math.Sqrt(float64(n)))
	}
	for i := 0; i < n; i++ {
		a[i*n+i] += 2
	}
	return a
}

func qrCheck(s *Suite, n, batch int, f64, inPlace bool) {
	nb := max(batch, 1)
	shape := withBatch(batch, []int{n, n})
	var av []float64
	for b := 0; b < nb; b++ {
		av = append(av, wellCond(s, n)...)
	}
	a := s.Const(tensor.F32, av, shape...)
	av = s.Read(a)
	q := a
	if !inPlace {
		q = s.Empty(tensor.F32, shape...)
	}
	st := s.Empty(tensor.I32, nb)
	s.NoErr("qr", s.E.QR(ops.QR{A: a, Q: q, F64: f64, Status: st}))
	qv, stv := s.Read(q), readI32(s, st)
	tol := qrTol(n, f64)
	for b := 0; b < nb; b++ {
		if stv[b] != 0 {
			s.T.Errorf("matrix %d: status %d", b, stv[b])
		}
		ab, qb := av[b*n*n:(b+1)*n*n], qv[b*n*n:(b+1)*n*n]
		ref, _ := RefQRRows(ab, n)
		s.Close(fmt.Sprintf("matrix %d: Q", b), qb, ref, nil, 4*tol)
		// Q·Qᵀ = I; Lo = A·Qᵀ lower triangular with diag ≥ 0.
		orth, upper, anorm, minDiag := QRRowsResiduals(ab, qb, n)
		if orth > tol*math.Sqrt(float64(n)) {
			s.T.Errorf("matrix %d: ‖Q·Qᵀ − I‖_F = %.3g", b, orth)
		}
		if upper > tol*anorm {
			s.T.Errorf("matrix %d: A·Qᵀ has %.3g above its diagonal (‖A‖ = %.3g)", b, upper, anorm)
		}
		if minDiag < 0 {
			s.T.Errorf("matrix %d: diag(Lo) has %v < 0 (sign convention)", b, minDiag)
		}
	}
}

// QRRowsResiduals measures how far q (n×n, row-major) is from an
// orthonormalisation of a's rows in the sign convention of RefQRRows:
// orth = ‖Q·Qᵀ − I‖_F, upper = the Frobenius norm of the part of
// Lo = A·Qᵀ above its diagonal, anorm = ‖A‖_F, and minDiag = min_i Lo_ii
// (≥ 0 in the convention). All in float64.
func QRRowsResiduals(a, q []float64, n int) (orth, upper, anorm, minDiag float64) {
	minDiag = math.Inf(1)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			var d, l float64
			for k := 0; k < n; k++ {
				d += q[i*n+k] * q[j*n+k]
				l += a[i*n+k] * q[j*n+k]
			}
			if i == j {
				d--
				minDiag = math.Min(minDiag, l)
			}
			orth += d * d
			if j > i {
				upper += l * l
			}
			anorm += a[i*n+j] * a[i*n+j]
		}
	}
	return math.Sqrt(orth), math.Sqrt(upper), math.Sqrt(anorm), minDiag
}

// qrFailure: a matrix with a NaN gets status 1 and keeps its Q; the
// others are factorised.
func qrFailure(s *Suite) {
	const n = 5
	av := append(wellCond(s, n), wellCond(s, n)...)
	av[n*n+7] = math.NaN()
	a := s.Const(tensor.F32, av, 2, n, n)
	qv := make([]float64, 2*n*n)
	for i := range qv {
		qv[i] = 0.25
	}
	q := s.Const(tensor.F32, qv, 2, n, n)
	st := s.Empty(tensor.I32, 2)
	s.NoErr("qr", s.E.QR(ops.QR{A: a, Q: q, Status: st}))
	got, stv := s.Read(q), readI32(s, st)
	if stv[0] != 0 || stv[1] != 1 {
		s.T.Errorf("status %v, want [0 1]", stv)
	}
	for _, v := range got[n*n:] {
		if v != 0.25 {
			s.T.Fatalf("failed matrix's Q changed: %v", got[n*n:])
		}
	}
	ref, _ := RefQRRows(s.Read(a)[:n*n], n)
	s.Close("good matrix", got[:n*n], ref, nil, 4*qrTol(n, false))
}

// spdDistinct is a symmetric positive definite n×n matrix U·diag(1..n)·Uᵀ
// for a random orthogonal U (eigenvalues 1, 2, …, n), scaled by scale.
func spdDistinct(s *Suite, n int, scale float64) []float64 {
	u := RandOrth(s.R, n)
	a := make([]float64, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			for k := 0; k < n; k++ {
				a[i*n+j] += u[k*n+i] * float64(k+1) * u[k*n+j]
			}
		}
	}
	for i := range a {
		a[i] *= scale
	}
	return a
}

// soapBasisCheck: one refresh of a batch of 3 random orthonormal bases
// for SPD statistics against RefSOAPBasis (from the stored f32 inputs):
// the permutation exactly (the estimates are far apart but for rare
// draws: a pair closer than the f32 product's rounding is reported), the
// basis to the QR tolerance scaled by how well each row is determined.
func soapBasisCheck(s *Suite, n int) {
	const batch = 3
	var lv, qv []float64
	for b := 0; b < batch; b++ {
		lv = append(lv, spdDistinct(s, n, 1/float64(n))...)
		qv = append(qv, RandOrth(s.R, n)...)
	}
	l := s.Const(tensor.F32, lv, batch, n, n)
	q := s.Const(tensor.F32, qv, batch, n, n)
	lv, qv = s.Read(l), s.Read(q)
	perm := s.Empty(tensor.I32, batch, n)
	st := s.Empty(tensor.I32, batch)
	s.NoErr("soap basis", s.E.SOAPBasis(ops.SOAPBasis{L: l, Q: q, Perm: perm, Status: st}))
	got, pv, stv := s.Read(q), readI32(s, perm), readI32(s, st)
	for b := 0; b < batch; b++ {
		if stv[b] != 0 {
			s.T.Errorf("matrix %d: status %d", b, stv[b])
		}
		want, wp, diag := RefSOAPBasis(lv[b*n*n:(b+1)*n*n], qv[b*n*n:(b+1)*n*n], n)
		for k := range wp {
			if int(pv[b*n+k]) != wp[k] {
				s.T.Fatalf("matrix %d: permutation %v, want %v", b, pv[b*n:(b+1)*n], wp)
			}
		}
		dmax := 0.0
		for _, d := range diag {
			dmax = math.Max(dmax, d)
		}
		for k := 0; k < n; k++ {
			tol := 20 * qrTol(n, false) * dmax / diag[k]
			if e := TermsErr(got[(b*n+k)*n:(b*n+k+1)*n], want[k*n:(k+1)*n], nil); !(e <= tol) {
				s.T.Errorf("matrix %d row %d: relative error %.3g > %.3g", b, k, e, tol)
			}
		}
	}
}

// soapBasisConverges: repeated refreshes with fixed statistics are
// subspace iteration, so the basis converges to the statistics'
// eigenvectors: after 60 refreshes (eigenvalue ratios (k−1)/k, k ≤ 8: the
// slowest direction converges as (7/8)^60 ≈ 3e-4) Q·S·Qᵀ is diagonal to
// 1e-3 of ‖S‖ in ascending order, and Q stays orthonormal.
func soapBasisConverges(s *Suite) {
	const n = 8
	lv := spdDistinct(s, n, 1)
	l := s.Const(tensor.F32, lv, 1, n, n)
	lv = s.Read(l)
	q := s.Const(tensor.F32, RandOrth(s.R, n), 1, n, n)
	perm := s.Empty(tensor.I32, 1, n)
	for i := 0; i < 60; i++ {
		s.NoErr("soap basis", s.E.SOAPBasis(ops.SOAPBasis{L: l, Q: q, Perm: perm}))
	}
	qv := s.Read(q)
	var off, nrm, orth float64
	prev := math.Inf(-1)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			var d, o float64
			for a := 0; a < n; a++ {
				o += qv[i*n+a] * qv[j*n+a]
				for c := 0; c < n; c++ {
					d += qv[i*n+a] * lv[a*n+c] * qv[j*n+c]
				}
			}
			nrm += lv[i*n+j] * lv[i*n+j]
			if i == j {
				o--
				if d < prev {
					s.T.Errorf("estimate %d = %v below the previous %v: not ascending", i, d, prev)
				}
				prev = d
			} else {
				off += d * d
			}
			orth += o * o
		}
	}
	if math.Sqrt(off) > 1e-3*math.Sqrt(nrm) {
		t := math.Sqrt(off) / math.Sqrt(nrm)
		s.T.Errorf("Q·S·Qᵀ off the diagonal: %.3g of ‖S‖", t)
	}
	if math.Sqrt(orth) > 1e-5 {
		s.T.Errorf("‖Q·Qᵀ − I‖_F = %.3g", math.Sqrt(orth))
	}
}

// soapBasisFailure: statistics with a NaN keep their basis, with the
// identity permutation and status 1; the others are refreshed.
func soapBasisFailure(s *Suite) {
	const n = 4
	lv := append(spdDistinct(s, n, 1), spdDistinct(s, n, 1)...)
	lv[n*n+5] = math.NaN()
	l := s.Const(tensor.F32, lv, 2, n, n)
	qv := append(RandOrth(s.R, n), RandOrth(s.R, n)...)
	q := s.Const(tensor.F32, qv, 2, n, n)
	qv = s.Read(q)
	perm := s.Empty(tensor.I32, 2, n)
	st := s.Empty(tensor.I32, 2)
	s.NoErr("soap basis", s.E.SOAPBasis(ops.SOAPBasis{L: l, Q: q, Perm: perm, Status: st}))
	got, pv, stv := s.Read(q), readI32(s, perm), readI32(s, st)
	if stv[0] != 0 || stv[1] != 1 {
		s.T.Errorf("status %v, want [0 1]", stv)
	}
	for k := 0; k < n; k++ {
		if pv[n+k] != int32(k) {
			s.T.Errorf("failed matrix's permutation %v, want the identity", pv[n:])
			break
		}
	}
	for i := n * n; i < 2*n*n; i++ {
		if got[i] != qv[i] {
			s.T.Fatalf("failed matrix's basis changed")
		}
	}
}

// soapPermuteBlocking is a 7×5 matrix in blocks of at most 3 (padded).
func soapPermuteBlocking(s *Suite) ops.Blocking {
	blk, err := ops.NewBlocking(7, 5, 3)
	s.NoErr("blocking", err)
	return blk
}

// randPerms is count random permutations of n, as a [count, n] i32 tensor.
func randPerms(s *Suite, count, n int) (*tensor.Tensor, []int) {
	var p []int
	for b := 0; b < count; b++ {
		p = append(p, s.R.Perm(n)...)
	}
	v := make([]int32, len(p))
	for i, x := range p {
		v[i] = int32(x)
	}
	t := s.Empty(tensor.I32, count, n)
	s.NoErr("write", t.Write(tensor.AsBytes(v)))
	return t, p
}

func soapPermuteCheck(s *Suite) {
	blk := soapPermuteBlocking(s)
	v, vv := s.Rand(tensor.F32, 1, blk.Shape()...)
	rows, rp := randPerms(s, blk.Count(), blk.BR)
	cols, cp := randPerms(s, blk.Count(), blk.BC)
	s.NoErr("soap permute", s.E.SOAPPermute(v, rows, cols, blk))
	got := s.Read(v)
	for b := 0; b < blk.Count(); b++ {
		for r := 0; r < blk.BR; r++ {
			for c := 0; c < blk.BC; c++ {
				want := vv[(b*blk.BR+rp[b*blk.BR+r])*blk.BC+cp[b*blk.BC+c]]
				if g := got[(b*blk.BR+r)*blk.BC+c]; g != want {
					s.T.Fatalf("block %d (%d, %d): %v, want %v", b, r, c, g, want)
				}
			}
		}
	}
}

// soapPermuteConsistent: SOAP's preconditioned step (rotate G and M into
// the bases, Adam's second moment and step there, rotate back) with bases
// whose rows are permuted (row k of Q_L' = row πL(k) of Q_L, likewise
// Q_R') and V permuted by SOAPPermute equals the step with the unpermuted
// bases and V, and the new V are each other's permutation: the step does
// not depend on the order of the basis vectors once V follows them.
// Unpadded blocks (a padded block's order is fixed by PadDiag).
func soapPermuteConsistent(s *Suite) {
	blk, err := ops.NewBlocking(6, 8, 4)
	s.NoErr("blocking", err)
	k := blk.Count()
	shape := blk.Shape()
	var qlv, qrv []float64
	for b := 0; b < k; b++ {
		qlv = append(qlv, RandOrth(s.R, blk.BR)...)
		qrv = append(qrv, RandOrth(s.R, blk.BC)...)
	}
	g, _ := s.Rand(tensor.F32, 1, shape...)
	m, _ := s.Rand(tensor.F32, 1, shape...)
	_, vv := s.Rand(tensor.F32, 1, shape...)
	for i := range vv {
		vv[i] *= vv[i]
	}
	rows, rp := randPerms(s, k, blk.BR)
	cols, cp := randPerms(s, k, blk.BC)
	permute := func(q []float64, p []int, d int) []float64 {
		out := make([]float64, len(q))
		for b := 0; b < k; b++ {
			for r := 0; r < d; r++ {
				copy(out[(b*d+r)*d:(b*d+r+1)*d], q[(b*d+p[b*d+r])*d:(b*d+p[b*d+r]+1)*d])
			}
		}
		return out
	}
	step := func(ql, qr []float64, vperm bool) (n, v []float64) {
		qlt := s.Const(tensor.F32, ql, k, blk.BR, blk.BR)
		qrt := s.Const(tensor.F32, qr, k, blk.BC, blk.BC)
		vt := s.Const(tensor.F32, vv, shape...)
		if vperm {
			s.NoErr("permute", s.E.SOAPPermute(vt, rows, cols, blk))
		}
		t1, gr, mr, nr, out := s.Empty(tensor.F32, shape...), s.Empty(tensor.F32, shape...), s.Empty(tensor.F32, shape...),
			s.Empty(tensor.F32, shape...), s.Empty(tensor.F32, shape...)
		for _, in := range []struct{ x, out *tensor.Tensor }{{g, gr}, {m, mr}} {
			s.NoErr("rotate", s.E.Matmul(ops.Matmul{A: qlt, B: in.x, D: t1, FullF32: true}))
			s.NoErr("rotate", s.E.Matmul(ops.Matmul{A: t1, B: qrt, D: in.out, TransB: true, FullF32: true}))
		}
		s.NoErr("adam", s.E.SOAPAdam(vt, gr, mr, nr, blk, 0.95, 1e-8))
		s.NoErr("back", s.E.Matmul(ops.Matmul{A: qlt, B: nr, D: t1, TransA: true, FullF32: true}))
		s.NoErr("back", s.E.Matmul(ops.Matmul{A: t1, B: qrt, D: out, FullF32: true}))
		return s.Read(out), s.Read(vt)
	}
	n0, v0 := step(qlv, qrv, false)
	n1, v1 := step(permute(qlv, rp, blk.BR), permute(qrv, cp, blk.BC), true)
	s.Close("step with permuted bases and V", n1, n0, nil, 1e-5)
	vt := s.Const(tensor.F32, v0, shape...)
	s.NoErr("permute", s.E.SOAPPermute(vt, rows, cols, blk))
	s.Close("V after the step", v1, s.Read(vt), nil, 1e-6)
}

func qrValidation(s *Suite) {
	sq := s.Empty(tensor.F32, 2, 4, 4)
	blk := soapPermuteBlocking(s)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"non-square", s.E.QR(ops.QR{A: s.Empty(tensor.F32, 3, 4), Q: s.Empty(tensor.F32, 3, 4)}), tensor.ErrShape},
		{"bf16", s.E.QR(ops.QR{A: s.Empty(tensor.BF16, 4, 4), Q: s.Empty(tensor.BF16, 4, 4)}), tensor.ErrDType},
		{"Q shape", s.E.QR(ops.QR{A: sq, Q: s.Empty(tensor.F32, 4, 4)}), tensor.ErrShape},
		{"Status dtype", s.E.QR(ops.QR{A: sq, Q: sq, Status: s.Empty(tensor.F32, 2)}), tensor.ErrDType},
		{"basis rank 2", s.E.SOAPBasis(ops.SOAPBasis{L: s.Empty(tensor.F32, 4, 4), Q: s.Empty(tensor.F32, 4, 4), Perm: s.Empty(tensor.I32, 1, 4)}), tensor.ErrShape},
		{"basis Perm dtype", s.E.SOAPBasis(ops.SOAPBasis{L: sq, Q: sq, Perm: s.Empty(tensor.F32, 2, 4)}), tensor.ErrDType},
		{"basis Perm shape", s.E.SOAPBasis(ops.SOAPBasis{L: sq, Q: sq, Perm: s.Empty(tensor.I32, 2, 3)}), tensor.ErrShape},
		{"permute rows shape", s.E.SOAPPermute(s.Empty(tensor.F32, blk.Shape()...), s.Empty(tensor.I32, blk.Count(), blk.BR+1), s.Empty(tensor.I32, blk.Count(), blk.BC), blk), tensor.ErrShape},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			s.T.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
}
