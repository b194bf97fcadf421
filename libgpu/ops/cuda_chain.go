package ops

import (
	"fmt"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/tensor"
)

// linearBackwardChain is Engine.LinearBackwardChain on CUDA.
//
// With the notation of cuda_linear.go (row-major r[R,C] is the column-major
// rᶜ, C×R, ld C), x[M,K], w[N,K], dz[M,N], dxPrev and z_prev [M,K]:
//
//	weight  dw = dzᵀ·x        ⇔ dwᶜ (K×N) = xᶜ · (dzᶜ)ᵀ   A = xᶜ (K×M, ld K), B = dzᶜ (N×M, ld N), TransB;  m=K, n=N, k=M
//	data    dxPrev = dz·w     ⇔ dxᶜ (K×M) = wᶜ · dzᶜ      A = wᶜ (K×N, ld K), B = dzᶜ (N×M, ld N);          m=K, n=M, k=N
//
// db[j] = Σ_i dz[i,j] is one value per column of the weight GEMM's D (N of
// them), reduced over its k = M: EPILOGUE_BGRADB, as in LinearBackward.
//
// dbPrev[p] = Σ_i dxPrev[i,p] is one value per row of the data GEMM's D
// (K of them, p = feature of the previous layer), reduced over D's n = M
// columns (the batch): that is what the bias pointer of DRELU_BGRAD and
// DGELU_BGRAD receives ("output vector with length that matches the number
// of rows of matrix D", CUBLASLT_MATMUL_DESC_BIAS_POINTER, cuBLAS docs),
// computed from the output after the activation gradient was applied. The
// aux operand of those epilogues has D's shape K×M:
//
//   - DRELU(_BGRAD): the ReLU bit-mask, ld in bits = ⌈K/128⌉·128 =
//     ReLUMaskCols(K)·8, i.e. the u8 [M, ReLUMaskCols(K)] tensor that the
//     previous layer's Linear wrote with RELU_AUX_BIAS (its D was yᶜ, K×M:
//     the same layout).
//   - DGELU(_BGRAD): z_prev as f32, ld K (z_prev[M,K] row-major is
//     z_prevᶜ, K×M, ld K); cuBLASLt requires this ld to be a multiple of
//     8, so an odd K takes the unfused path.
//
// GELU's derivative is not fused under PrecF32, for the reason the forward
// GELU is not (cuda_linear.go). Without a fused epilogue (refused, odd
// shapes, noFuse, ActNone, or ReLU without a mask): a plain dx GEMM, then
// act_bwd_colsum in place over dxPrev with aux = x for ReLU (x = relu(z_prev)
// > 0 ⇔ z_prev > 0) or z_prev for GELU, summing dbPrev in fixed order.
func (c *cudaImpl) linearBackwardChain(dxPrev, dw, db, dbPrev, dz, x, w, auxPrev *tensor.Tensor, actPrev Act) error {
	m, k, n := x.Shape[0], x.Shape[1], w.Shape[0]
	if err := checkDims(m, k, n); err != nil {
		return err
	}
	return c.Do(func() error {
		dzp, dwp, dbp := devPtr(dz), devPtr(dw), devPtr(db)
		dzB, wB, xB := dzp, devPtr(w), devPtr(x)
		if c.prec == PrecBF16 {
			var err error
			if dzB, err = c.castBF16("bf16_dz", dzp, int64(m)*int64(n)); err != nil {
				return err
			}
			if dxPrev != nil {
				if wB, err = c.castBF16("bf16_w", wB, int64(n)*int64(k)); err != nil {
					return err
				}
			}
			if xB, err = c.castBF16("bf16_x", xB, int64(m)*int64(k)); err != nil {
				return err
			}
		}

		// dw (and db through BGRADB).
		spec := cuda.GemmSpec{TransB: true, M: k, N: n, K: m, LDA: k, LDB: n, LDC: k, LDD: k}
		args := cuda.GemmArgs{A: xB, B: dzB, D: dwp}
		fusedDB := false
		if db != nil {
			spec.Epilogue, args.Bias = cuda.EpilogueBGradB, dbp
			ok, err := c.tryFused(spec, args)
			if err != nil {
				return fmt.Errorf("ops: linear chain dw %dx%dx%d: %w", m, k, n, err)
			}
			fusedDB = ok
		}
		if !fusedDB {
			// Without db (the chain's caller got it from the layer above as
			// its dbPrev) or when BGRADB is refused: a plain dw GEMM.
			spec.Epilogue, args.Bias = cuda.EpilogueDefault, 0
			if err := c.gemm(spec, args); err != nil {
				return fmt.Errorf("ops: linear chain dw %dx%dx%d: %w", m, k, n, err)
			}
			if db != nil {
				if err := c.actBwd(0, dzp, 0, ActNone, m, n, dbp); err != nil {
					return err
				}
			}
		}
		if dxPrev == nil {
			return nil
		}

		// dxPrev (and dbPrev) with act_prev' fused when cuBLASLt has it.
		dxp, dbpp, auxp := devPtr(dxPrev), devPtr(dbPrev), devPtr(auxPrev)
		spec = cuda.GemmSpec{M: k, N: m, K: n, LDA: k, LDB: n, LDC: k, LDD: k}
		args = cuda.GemmArgs{A: wB, B: dzB, D: dxp}
		switch {
		case actPrev == ActReLU && auxp != 0:
			spec.Epilogue, spec.AuxLD, args.Aux = cuda.EpilogueDReLU, ReLUMaskCols(k)*8, auxp
			if dbpp != 0 {
				spec.Epilogue, args.Bias = cuda.EpilogueDReLUBGrad, dbpp
			}
		case actPrev == ActGELU && c.prec != PrecF32:
			spec.Epilogue, spec.AuxLD, args.Aux = cuda.EpilogueDGELU, k, auxp
			if dbpp != 0 {
				spec.Epilogue, args.Bias = cuda.EpilogueDGELUBGrad, dbpp
			}
		}
		if spec.Epilogue != 0 {
			ok, err := c.tryFused(spec, args)
			if err != nil {
				return fmt.Errorf("ops: linear chain dx %dx%dx%d: %w", m, k, n, err)
			}
			if ok {
				return nil
			}
		}
		spec.Epilogue, spec.AuxLD = cuda.EpilogueDefault, 0
		args.Bias, args.Aux = 0, 0
		if err := c.gemm(spec, args); err != nil {
			return fmt.Errorf("ops: linear chain dx %dx%dx%d: %w", m, k, n, err)
		}
		switch actPrev {
		case ActReLU:
			return c.actBwd(dxp, dxp, devPtr(x), ActReLU, m, k, dbpp)
		case ActGELU:
			return c.actBwd(dxp, dxp, auxp, ActGELU, m, k, dbpp)
		}
		if dbpp != 0 {
			return c.actBwd(0, dxp, 0, ActNone, m, k, dbpp)
		}
		return nil
	})
}
