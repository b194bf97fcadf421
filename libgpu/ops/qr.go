package ops

// QR orthonormalisation of the rows of a batch of square matrices (QR), and
// SOAP's refresh of an eigenbasis by one step of power iteration followed
// by it (SOAPBasis, with the second moment's permutation SOAPPermute).
// QR runs gonum's QR in float64 on the host and cuSOLVER's geqrf + orgqr
// (f32, or f64 on request) on CUDA, with the signs fixed alike (diag ≥ 0).
// Element-wise steps in libgpu/kernels/matroot.cu and precond.cu.
// Reference and checks: opstest/qr.go.

import (
	"fmt"
	"math"
	"sort"

	"gonum.org/v1/gonum/mat"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// QR describes the orthonormalisation of the rows of a batch of matrices,
// in order (Gram–Schmidt, computed by Householder reflections):
//
//	A[b] = Lo[b]·Q[b],  Lo lower triangular with diag(Lo) ≥ 0,  Q·Qᵀ = I
//
// that is, Q[b]ᵀ is the orthogonal factor of the QR factorisation
// A[b]ᵀ = Q[b]ᵀ·R with diag(R) ≥ 0 (the sign convention, which libraries
// leave open, fixed so that the host and CUDA agree). Row i of Q depends
// on rows 0..i of A only. The rows are the convention of Eigh (whose
// eigenvectors are Q's rows). A and Q are [n, n] or [B, n, n] f32,
// contiguous, of one shape; Q may be A. Where A is rank-deficient the
// factorisation still gives orthonormal rows (the ones past the rank
// complete the basis).
//
// On the host the factorisation runs in float64 (gonum's QR); on CUDA in
// f32 (cuSOLVER's geqrf and orgqr), or in float64 with F64. A matrix whose
// result is not finite (A was not) keeps the Q it had, and Status[b]
// (optional, [B] i32) is 1 for it, 0 for the others.
type QR struct {
	A, Q   *tensor.Tensor
	F64    bool
	Status *tensor.Tensor
}

// QR orthonormalises the rows of a batch of matrices (see the type).
// Errors wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout,
// exec.ErrDevice, or the solver's error (cuSOLVER missing: cuda.ErrNoLibrary).
func (e *Engine) QR(d QR) error {
	if err := e.checkView("qr A", d.A, true, f32Only); err != nil {
		return err
	}
	batch, n, err := rootGeom("qr A", d.A)
	if err != nil {
		return err
	}
	if err := e.checkView("qr Q", d.Q, true, f32Only, d.A.Shape...); err != nil {
		return err
	}
	if d.Status != nil {
		if err := e.checkView("qr Status", d.Status, true, []tensor.DType{tensor.I32}, batch); err != nil {
			return err
		}
	}
	return e.dispatch(func(*hostImpl) error { return hostQR(d.A, d.Q, d.Status, batch, n) },
		func(c *cudaImpl) error { return c.qr(d, batch, n) })
}

// hostQR factorises each Aᵀ in float64 with gonum's QR and writes the
// orthogonal factor's columns, signed so that diag(R) ≥ 0, as Q's rows; a
// matrix with a non-finite result keeps Q and gets status 1.
func hostQR(a, q, status *tensor.Tensor, batch, n int) error {
	av, err := hostIn(a)
	if err != nil {
		return err
	}
	qv, err := q.ReadFloat32()
	if err != nil {
		return err
	}
	var st []int32
	if status != nil {
		if st, err = status.I32(); err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
	}
	m := mat.NewDense(n, n, nil)
	var f mat.QR
	var qf, rf mat.Dense
	out := make([]float32, n*n)
	for b := 0; b < batch; b++ {
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				m.Set(j, i, float64(av[(b*n+i)*n+j])) // Aᵀ
			}
		}
		f.Factorize(m)
		f.QTo(&qf)
		f.RTo(&rf)
		ok := true
		for j := 0; j < n; j++ {
			s := 1.0
			if rf.At(j, j) < 0 {
				s = -1
			}
			for i := 0; i < n; i++ {
				v := s * qf.At(i, j) // row j of Q: column j of Aᵀ's orthogonal factor
				ok = ok && !math.IsNaN(v) && !math.IsInf(v, 0)
				out[j*n+i] = float32(v)
			}
		}
		if st != nil {
			st[b] = 0
			if !ok {
				st[b] = 1
			}
		}
		if ok {
			copy(qv[b*n*n:(b+1)*n*n], out)
		}
	}
	return q.WriteFloat32(qv)
}

// qr runs geqrf and orgqr per matrix on a scratch copy (f32, or widened to
// f64; column-major, the copy is Aᵀ), records diag(R)'s signs between
// them, applies the signs to the rows while narrowing, and commits the
// matrices whose result is finite.
func (c *cudaImpl) qr(d QR, batch, n int) error {
	solver, err := c.Solver()
	if err != nil {
		return fmt.Errorf("ops: qr: %w", err)
	}
	dt, size := cuda.R32F, int64(4)
	if d.F64 {
		dt, size = cuda.R64F, 8
	}
	nn := int64(n) * int64(n)
	total := int64(batch) * nn
	work, err := c.Scratch("qr.work", total*size)
	if err != nil {
		return err
	}
	tau, err := c.Scratch("qr.tau", int64(batch)*int64(n)*size)
	if err != nil {
		return err
	}
	sgn, err := c.Scratch("qr.sign", int64(batch)*int64(n)*4)
	if err != nil {
		return err
	}
	info, err := c.Scratch("qr.info", int64(batch)*8)
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
	l1, err := solver.GeqrfBufferSize(dt, n, n, n, work)
	if err != nil {
		return fmt.Errorf("ops: qr: %w", err)
	}
	l2, err := solver.OrgqrBufferSize(dt, n, n, n, n, work, tau)
	if err != nil {
		return fmt.Errorf("ops: qr: %w", err)
	}
	lwork := max(l1, l2, 1)
	if err := c.solverLanes("qr.ws", batch, int64(lwork)*size, func(solver *cuda.SolverHandle, b int64, ws cuda.DevicePtr) error {
		return solver.Geqrf(c.Stream(), dt, n, n, n, work.Add(b*nn*size), tau.Add(b*int64(n)*size), ws, lwork,
			info.Add(b*8))
	}); err != nil {
		return fmt.Errorf("ops: qr (n = %d): %w", n, err)
	}
	inst := "f32" // the instance of the factors' dtype (qr_signs_f32, qr_apply_f64, ...)
	if d.F64 {
		inst = "f64"
	}
	cnt := int64(batch) * int64(n)
	if err := launch.QrSigns(c, inst, grid1(int(min(cnt/256+1, 65535))), block1(256), 0,
		work, sgn, int32(n), cnt); err != nil {
		return err
	}
	if err := c.solverLanes("qr.ws", batch, int64(lwork)*size, func(solver *cuda.SolverHandle, b int64, ws cuda.DevicePtr) error {
		return solver.Orgqr(c.Stream(), dt, n, n, n, n, work.Add(b*nn*size), tau.Add(b*int64(n)*size), ws, lwork,
			info.Add(b*8+4))
	}); err != nil {
		return fmt.Errorf("ops: qr (n = %d): %w", n, err)
	}
	qf, err := c.Scratch("qr.qf", total*4)
	if err != nil {
		return err
	}
	if err := launch.QrApply(c, inst, grid1(int(min(total/256+1, 65535))), block1(256), 0,
		work, sgn, qf, int32(n), total); err != nil {

		return err
	}
	status := devPtr(d.Status)
	if status == 0 {
		if status, err = c.Scratch("qr.status", int64(batch)*4); err != nil {
			return err
		}
	}
	if err := launch.QrStatus(c, grid1(batch), block1(256), 0, info, qf, nn, status); err != nil {
		return err
	}
	return launch.RootCommit(c, grid1(int(min(total/256+1, 65535))), block1(256), 0, qf, devPtr(d.Q), status, total, nn)
}

// SOAPBasis describes SOAP's refresh of a batch of eigenbases by one step
// of power iteration followed by QR (Vyas et al. 2024, "SOAP: Improving
// and Stabilizing Shampoo using Adam", §"Efficiency"; the reference code's
// get_orthogonal_matrix_QR), in Eigh's convention (the basis vectors are
// Q's rows). Per matrix b, with S = L[b] (symmetric: the statistics) and
// q_i the rows of Q[b] (orthonormal: the basis in use):
//
//	e_i = q_i·S·q_iᵀ                         (estimated eigenvalues)
//	π   = the stable ascending sort of e      (Perm[b][k] = π(k); NaN last)
//	P   = rows q_π(d−1)·S, …, q_π(0)·S        (power iteration, descending)
//	Q[b] ← rows of QR(P) (see QR), in reverse order
//
// so new row k refines old row π(k) and the rows stay in ascending order
// of their eigenvalue estimates (as Eigh's, so PadDiag's padded
// coordinates stay last). The orthonormalisation runs in descending order,
// as the reference's QR of the columns sorted by descending estimate: the
// dominant directions are kept and the rounding of a near-null space only
// mixes the smallest. The second moment kept in the old basis is carried
// over by permuting it with Perm (SOAPPermute). L and Q are [B, d, d]
// f32, Perm [B, d] i32, Status (optional) [B] i32: a matrix whose QR is
// not finite keeps its Q, gets Perm[b] = identity and status 1. The
// product S·q runs in full f32 whatever the engine's precision; the QR
// in f32 on CUDA, or float64 with F64 (the host always uses float64).
type SOAPBasis struct {
	L, Q, Perm *tensor.Tensor
	F64        bool
	Status     *tensor.Tensor
}

// SOAPBasis refreshes a batch of eigenbases (see the type). Errors wrap
// tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice, or the
// solver's.
func (e *Engine) SOAPBasis(s SOAPBasis) error {
	if err := e.checkView("soap basis L", s.L, true, f32Only); err != nil {
		return err
	}
	if s.L.Rank() != 3 {
		return fmt.Errorf("%w: soap basis L is %v, want [B, d, d]", tensor.ErrShape, s.L.Shape)
	}
	batch, d, err := rootGeom("soap basis L", s.L)
	if err != nil {
		return err
	}
	if err := e.checkView("soap basis Q", s.Q, true, f32Only, s.L.Shape...); err != nil {
		return err
	}
	if err := e.checkView("soap basis Perm", s.Perm, true, []tensor.DType{tensor.I32}, batch, d); err != nil {
		return err
	}
	status := s.Status
	if status != nil {
		if err := e.checkView("soap basis Status", status, true, []tensor.DType{tensor.I32}, batch); err != nil {
			return err
		}
	} else if status, err = e.ScratchTensor("soap.basis.status", tensor.I32, batch); err != nil {
		return err
	}
	p, err := e.ScratchTensor("soap.basis.power", tensor.F32, batch, d, d)
	if err != nil {
		return err
	}
	if err := e.Matmul(Matmul{A: s.Q, B: s.L, D: p, FullF32: true}); err != nil { // row i: q_i·S
		return err
	}
	est, err := e.ScratchTensor("soap.basis.est", tensor.F32, batch, d)
	if err != nil {
		return err
	}
	g, err := e.ScratchTensor("soap.basis.sorted", tensor.F32, batch, d, d)
	if err != nil {
		return err
	}
	total := int64(batch) * int64(d) * int64(d)
	if err := e.dispatch(func(*hostImpl) error {
		pv, _ := p.F32()
		qv, _ := s.Q.F32()
		ev, _ := est.F32()
		perm, _ := s.Perm.I32()
		gv, _ := g.F32()
		idx := make([]int, d)
		for b := 0; b < batch; b++ {
			for i := 0; i < d; i++ {
				var acc float32
				for k := 0; k < d; k++ {
					acc += pv[(b*d+i)*d+k] * qv[(b*d+i)*d+k]
				}
				ev[b*d+i] = acc
				idx[i] = i
			}
			key := func(i int) float32 {
				if v := ev[b*d+i]; v == v {
					return v
				}
				return float32(math.Inf(1))
			}
			sort.SliceStable(idx, func(x, y int) bool { return key(idx[x]) < key(idx[y]) })
			for k, i := range idx {
				perm[b*d+k] = int32(i)
			}
			for k := 0; k < d; k++ {
				src := idx[d-1-k]
				copy(gv[(b*d+k)*d:(b*d+k+1)*d], pv[(b*d+src)*d:(b*d+src+1)*d])
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		rows := int64(batch) * int64(d)
		if err := launch.SoapEst(c, gridFor(rows*32, 256), block1(256), 0,
			devPtr(p), devPtr(s.Q), devPtr(est), int32(d), rows); err != nil {
			return err
		}
		if err := launch.SoapRank(c, gridFor(rows, 256), block1(256), 0,
			devPtr(est), devPtr(s.Perm), int32(d), rows); err != nil {
			return err
		}
		return launch.SoapGatherDesc(c, gridFor(total, 256), block1(256), 0,
			devPtr(p), devPtr(s.Perm), devPtr(g), int32(d), total)
	}); err != nil {
		return err
	}
	if err := e.QR(QR{A: g, Q: g, F64: s.F64, Status: status}); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		gv, _ := g.F32()
		qv, _ := s.Q.F32()
		perm, _ := s.Perm.I32()
		st, _ := status.I32()
		for b := 0; b < batch; b++ {
			if st[b] != 0 {
				for k := 0; k < d; k++ {
					perm[b*d+k] = int32(k)
				}
				continue
			}
			for k := 0; k < d; k++ {
				copy(qv[(b*d+k)*d:(b*d+k+1)*d], gv[(b*d+d-1-k)*d:(b*d+d-k)*d])
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.SoapBasisCommit(c, gridFor(total, 256), block1(256), 0,
			devPtr(g), devPtr(s.Q), devPtr(s.Perm), devPtr(status), int32(d), total)
	})
}

// SOAPPermute carries SOAP's second moment V ([Count, BR, BC] f32,
// blocked as blk) over to refreshed bases: per block b,
//
//	V[b][r][c] ← V[b][rows[b][r]][cols[b][c]]
//
// with rows [Count, BR] and cols [Count, BC] i32 permutations (SOAPBasis's
// Perm of the block's left and right bases).
func (e *Engine) SOAPPermute(v, rows, cols *tensor.Tensor, blk Blocking) error {
	if err := blk.valid(); err != nil {
		return err
	}
	if err := e.checkView("soap permute V", v, true, f32Only, blk.Shape()...); err != nil {
		return err
	}
	i32 := []tensor.DType{tensor.I32}
	if err := e.checkView("soap permute rows", rows, true, i32, blk.Count(), blk.BR); err != nil {
		return err
	}
	if err := e.checkView("soap permute cols", cols, true, i32, blk.Count(), blk.BC); err != nil {
		return err
	}
	tmp, err := e.ScratchTensor("soap.permute", tensor.F32, blk.Shape()...)
	if err != nil {
		return err
	}
	if err := e.Copy(tmp, v); err != nil {
		return err
	}
	total := int64(blk.Count() * blk.BR * blk.BC)
	return e.dispatch(func(*hostImpl) error {
		tv, _ := tmp.F32()
		vv, _ := v.F32()
		rv, _ := rows.I32()
		cv, _ := cols.I32()
		for b := 0; b < blk.Count(); b++ {
			for r := 0; r < blk.BR; r++ {
				sr := int(rv[b*blk.BR+r])
				for c := 0; c < blk.BC; c++ {
					sc := int(cv[b*blk.BC+c])
					if sr < 0 || sr >= blk.BR || sc < 0 || sc >= blk.BC {
						return fmt.Errorf("%w: soap permute index (%d, %d) of block %d", ErrConfig, sr, sc, b)
					}
					vv[(b*blk.BR+r)*blk.BC+c] = tv[(b*blk.BR+sr)*blk.BC+sc]
				}
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.SoapPermute(c, gridFor(total, 256), block1(256), 0,
			devPtr(tmp), devPtr(v), devPtr(rows), devPtr(cols), int32(blk.BR), int32(blk.BC), total)
	})
}
