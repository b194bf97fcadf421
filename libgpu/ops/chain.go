package ops

import (
	"fmt"

	"gonum.org/v1/gonum/blas"

	"gpukit/libgpu/tensor"
)

// ReLUMaskCols is the number of bytes per row of the ReLU bit-mask of a
// linear layer with n outputs: ⌈n/128⌉·16. The mask of y[M,N] is a u8
// tensor [M, ReLUMaskCols(N)] in which bit j%8 (least significant first) of
// byte [i, j/8] is 1 exactly when z[i,j] > 0 (equivalently y[i,j] > 0);
// bits for j ≥ N mean nothing (the host backend writes 0). This is cuBLASLt's ReLU bit-mask
// (CUBLASLT_EPILOGUE_RELU_AUX, cublasLt.h) of the column-major D = yᵀ
// (N×M) seen through the row-major lens: one column of D (a row of y) per
// leading dimension of ⌈N/128⌉·128 bits, which cuBLASLt requires to be a
// multiple of 128 and at least D's row count (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD).
func ReLUMaskCols(n int) int { return (n + 127) / 128 * 16 }

// HasLinearChain reports whether models should take LinearBackwardChain
// (and ReLU bit-masks in Linear), which both backends have: true unless
// Options.NoLinearChain.
func (e *Engine) HasLinearChain() bool {
	return !e.opts.NoLinearChain
}

// LinearBackwardChain is the backward pass of a linear layer
// z = x·wᵀ + b (x[M,K], w[N,K], b[N], all f32) given dz[M,N] = ∂L/∂z, the
// gradient with respect to its pre-activation, fused with the activation
// derivative of the layer before it, whose output x = act_prev(z_prev) is
// this layer's input. It writes (overwriting, not accumulating):
//
//	dw[N,K]     = dzᵀ·x
//	db[N]       = Σ_rows dz                              (db may be nil)
//	dxPrev[M,K] = (dz·w) ⊙ act_prev'(z_prev)             (dxPrev may be nil: no data gradient)
//	dbPrev[K]   = Σ_rows dxPrev                          (may be nil; needs dxPrev)
//
// dxPrev is ∂L/∂z_prev, the dz of the previous layer's own
// LinearBackwardChain, and dbPrev is that layer's bias gradient (the
// previous layer then passes db = nil). For an MLP, the last layer's dz is
// the loss gradient (CrossEntropy's dlogits) and layer 0 passes
// dxPrev = nil.
//
// auxPrev, read only when dxPrev is non-nil, depends on actPrev:
//
//   - ActNone: ignored; dxPrev = dz·w.
//   - ActReLU: nil, and act_prev'(z_prev) = [x > 0] (x = relu(z_prev) is
//     positive exactly where z_prev is); or the u8 bit-mask [M,
//     ReLUMaskCols(K)] that Linear wrote for the previous layer, which lets
//     the CUDA backend fuse the derivative and dbPrev into the dx GEMM
//     (cuBLASLt's DRELU_BGRAD reads only this mask, 1/32 of the bytes of
//     an f32 y or z).
//   - ActGELU: z_prev [M,K] f32, the aux that Linear wrote (required);
//     GELU's derivative is that of the tanh approximation (DGELU_BGRAD).
//
// Backends without the op give exec.ErrNoBackend (see HasLinearChain). Other
// errors as Linear; dbPrev without dxPrev, or a missing GELU auxPrev, is
// tensor.ErrShape.
func (e *Engine) LinearBackwardChain(dxPrev, dw, db, dbPrev, dz, x, w, auxPrev *tensor.Tensor, actPrev Act) error {
	if err := checkAct(actPrev); err != nil {
		return err
	}
	m, k, err := matrix("linear chain x", x)
	if err != nil {
		return err
	}
	n, _, err := matrix("linear chain w", w)
	if err != nil {
		return err
	}
	if dbPrev != nil && dxPrev == nil {
		return fmt.Errorf("%w: linear chain dbPrev needs dxPrev", tensor.ErrShape)
	}
	checks := []struct {
		what string
		t    *tensor.Tensor
		opt  bool
		sh   []int
	}{
		{"linear chain x", x, false, []int{m, k}},
		{"linear chain w", w, false, []int{n, k}},
		{"linear chain dz", dz, false, []int{m, n}},
		{"linear chain dw", dw, false, []int{n, k}},
		{"linear chain db", db, true, []int{n}},
		{"linear chain dxPrev", dxPrev, true, []int{m, k}},
		{"linear chain dbPrev", dbPrev, true, []int{k}},
	}
	for _, c := range checks {
		if c.t == nil && c.opt {
			continue
		}
		if err := e.check(c.what, c.t, tensor.F32, c.sh...); err != nil {
			return err
		}
	}
	switch {
	case dxPrev == nil || actPrev == ActNone:
		auxPrev = nil
	case actPrev == ActGELU:
		if err := e.check("linear chain auxPrev (z_prev)", auxPrev, tensor.F32, m, k); err != nil {
			return err
		}
	case auxPrev != nil: // ReLU bit-mask
		if err := e.check("linear chain auxPrev (ReLU mask)", auxPrev, tensor.U8, m, ReLUMaskCols(k)); err != nil {
			return err
		}
	}
	return e.dispatch(func(h *hostImpl) error {
		return h.linearBackwardChain(dxPrev, dw, db, dbPrev, dz, x, w, auxPrev, actPrev)
	},
		func(c *cudaImpl) error {
			return c.linearBackwardChain(dxPrev, dw, db, dbPrev, dz, x, w, auxPrev, actPrev)
		})
}

// reluMaskBit reports bit j of row i of a ReLU bit-mask with ld bytes per row.
func reluMaskBit(mask []uint8, ld, i, j int) bool {
	return mask[i*ld+j/8]>>(j%8)&1 != 0
}

// writeReLUMask stores the bit-mask of z[m,n] > 0 (see ReLUMaskCols) into
// mask, padding bits 0.
func writeReLUMask(mask []uint8, z []float32, m, n int) {
	ld := ReLUMaskCols(n)
	clear(mask[:m*ld])
	for i := 0; i < m; i++ {
		row := mask[i*ld : (i+1)*ld]
		for j, v := range z[i*n : (i+1)*n] {
			if v > 0 {
				row[j/8] |= 1 << (j % 8)
			}
		}
	}
}

// LinearBackwardChain implements LinearChainer on the host: dz·w and dzᵀ·x
// through gonum's Sgemm, the derivative and column sums in f32 loops.
func (h *hostImpl) linearBackwardChain(dxPrev, dw, db, dbPrev, dz, x, w, auxPrev *tensor.Tensor, actPrev Act) error {
	s, err := f32s(dxPrev, dw, db, dbPrev, dz, x, w)
	if err != nil {
		return err
	}
	dxs, dws, dbs, dbps, dzs, xs, ws := s[0], s[1], s[2], s[3], s[4], s[5], s[6]
	m, k, n := x.Shape[0], x.Shape[1], w.Shape[0]
	// dw[N,K] = dzᵀ[N,M]·x[M,K]
	h.blas.Sgemm(blas.Trans, blas.NoTrans, n, k, m, 1, dzs, n, xs, k, 0, dws, k)
	colSum(dbs, dzs, m, n)
	if dxs == nil {
		return nil
	}
	// dxPrev[M,K] = dz[M,N]·w[N,K], then ⊙ act_prev'(z_prev).
	h.blas.Sgemm(blas.NoTrans, blas.NoTrans, m, k, n, 1, dzs, n, ws, k, 0, dxs, k)
	switch actPrev {
	case ActReLU:
		if auxPrev == nil {
			for i, v := range xs {
				if !(v > 0) {
					dxs[i] = 0
				}
			}
			break
		}
		mask, err := auxPrev.U8()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		ld := ReLUMaskCols(k)
		for i := 0; i < m; i++ {
			for j := 0; j < k; j++ {
				if !reluMaskBit(mask, ld, i, j) {
					dxs[i*k+j] = 0
				}
			}
		}
	case ActGELU:
		zs, err := auxPrev.F32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		for i, z := range zs {
			dxs[i] *= geluGrad(z)
		}
	}
	colSum(dbps, dxs, m, k)
	return nil
}

// colSum writes out[j] = Σ_i a[i,j] for a[m,n] row-major (nothing when out is nil).
func colSum(out, a []float32, m, n int) {
	if out == nil {
		return
	}
	clear(out[:n])
	for i := 0; i < m; i++ {
		for j, v := range a[i*n : (i+1)*n] {
			out[j] += v
		}
	}
}
