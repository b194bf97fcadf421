package ops

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// Row-major data seen by cuBLASLt (column-major) is transposed: a row-major
// A[r,c] with leading dimension c is the column-major Aᶜ = Aᵀ, c×r, ld c.
// With x[M,K], w[N,K], y/z/dy/dz[M,N] row-major, write xᶜ = xᵀ (K×M, ld K),
// wᶜ = wᵀ (K×N, ld K), yᶜ = yᵀ (N×M, ld N) and so on. Each product below is
// stated in cuBLASLt's terms, D(m×n) = op(A)(m×k) · op(B)(k×n), with
// GemmSpec's M, N, K being m, n, k:
//
//	forward   y = x·wᵀ      ⇔ yᶜ (N×M)  = (wᶜ)ᵀ · xᶜ        A = wᶜ, TransA, B = xᶜ;        m=N, n=M, k=K
//	data grad dx = dz·w     ⇔ dxᶜ (K×M) = wᶜ · dzᶜ          A = wᶜ, B = dzᶜ;               m=K, n=M, k=N
//	weight    dw = dzᵀ·x    ⇔ dwᶜ (K×N) = xᶜ · (dzᶜ)ᵀ       A = xᶜ, B = dzᶜ, TransB;       m=K, n=N, k=M
//
// The bias b[N] is one value per row of yᶜ, which is what cuBLASLt's BIAS
// epilogues add (one value per row of D). The bias gradient
// db[j] = Σ_i dz[i,j] is, in the weight-gradient product, the sum of op(B) =
// (dzᶜ)ᵀ (M×N) over its k = M rows for each of its n = N columns: exactly
// EPILOGUE_BGRADB ("bias gradient from B, one value per column of D, reduced
// over k", cublasLt.h).
//
// What is fused (the unfused fallback is taken per GEMM shape when cuBLASLt
// has no algorithm for the epilogue, and always when noFuse is set):
//
//   - Linear without aux: BIAS, RELU_BIAS or GELU_BIAS (RELU, GELU or DEFAULT
//     without a bias): one GEMM.
//   - Linear with aux and GELU: GELU_AUX_BIAS (GELU_AUX) stores z in aux and
//     gelu(z) in y: one GEMM.
//   - Linear with an f32 aux and ReLU or none: BIAS (DEFAULT) into y, then
//     bias_act stores aux = z and y = act(z). cuBLASLt's ReLU aux is a
//     bit-mask, not the z that the Impl contract promises.
//   - Linear with a u8 aux (ReLU bit-mask, ReLUMaskCols): RELU_AUX_BIAS
//     (RELU_AUX): one GEMM; unfused, bias_act then relu_mask.
//   - GELU under PrecF32 is never fused: BIAS (DEFAULT), then bias_act with
//     the full-precision tanhf. cuBLASLt does not document the accuracy of
//     its GELU epilogue's tanh (GEMM epilogues commonly use the hardware
//     tanh.approx, ~2⁻¹¹ relative error), and PrecF32 promises f32
//     arithmetic; under TF32 and bf16 the GEMM's own error dominates.
//   - LinearBackward: dz = dy ⊙ act'(aux) is one element-wise kernel
//     (act_bwd_colsum; skipped for ActNone, where dz is dy itself). The
//     DRELU/DGELU epilogues apply act' to a GEMM's *output*, so they would
//     fuse this layer's act' into the *next* layer's dx GEMM, across two
//     Impl calls; the Impl contract keeps each layer's backward separate.
//     db comes from the weight-gradient GEMM's BGRADB epilogue.
//     LinearBackwardChain (cuda_chain.go) is that cross-layer fusion:
//     DRELU_BGRAD / DGELU_BGRAD on the dx GEMM.
//   - Unfused: plain GEMMs, bias_act for bias and activation, and
//     act_bwd_colsum (+ colsum_final) computing dz and db in one pass with a
//     fixed-order (deterministic) two-stage column sum.
//
// Precision: PrecF32 uses CUBLAS_COMPUTE_32F, PrecTF32
// CUBLAS_COMPUTE_32F_FAST_TF32 on the f32 data; PrecBF16 rounds both GEMM
// operands to bf16 (cast_f32_bf16, into scratch) and multiplies them with
// f32 accumulation into f32 outputs (C, D, bias, aux stay f32, so bias and
// activation are applied in f32 and master weights never change type).

// devPtr is the device address of element 0 of t.
func devPtr(t *tensor.Tensor) cuda.DevicePtr {
	if t == nil {
		return 0
	}
	return cuda.DevicePtr(t.Ptr())
}

// actEpilogue is the cuBLASLt epilogue for act, with or without bias.
func actEpilogue(act Act, bias bool) cuda.Epilogue {
	switch {
	case act == ActReLU && bias:
		return cuda.EpilogueReLUBias
	case act == ActReLU:
		return cuda.EpilogueReLU
	case act == ActGELU && bias:
		return cuda.EpilogueGELUBias
	case act == ActGELU:
		return cuda.EpilogueGELU
	case bias:
		return cuda.EpilogueBias
	}
	return cuda.EpilogueDefault
}

// gemm queues D = epilogue(op(A)·op(B)) on the stream in the impl's
// precision: spec's types and compute type are set here (A and B must
// already be bf16 under PrecBF16), C and D are f32, beta is 0.
func (c *cudaImpl) gemm(spec cuda.GemmSpec, args cuda.GemmArgs) error {
	spec.CType, spec.DType = cuda.R32F, cuda.R32F
	switch c.prec {
	case PrecTF32:
		spec.AType, spec.BType, spec.Compute = cuda.R32F, cuda.R32F, cuda.Compute32FFastTF32
	case PrecBF16:
		spec.AType, spec.BType, spec.Compute = cuda.R16BF, cuda.R16BF, cuda.Compute32F
	default:
		spec.AType, spec.BType, spec.Compute = cuda.R32F, cuda.R32F, cuda.Compute32F
	}
	var err error
	if args.Workspace, args.WorkspaceSize, err = c.Workspace(); err != nil {
		return err
	}
	args.Alpha, args.Beta = 1, 0
	return c.Lt().Matmul(spec, args, c.Stream())
}

// tryFused runs a GEMM with a fused epilogue. It reports false, with nothing
// queued, when fusion is off or cuBLASLt has no algorithm for the epilogue
// with these shapes and types (remembered per spec); the caller then takes
// the unfused path.
func (c *cudaImpl) tryFused(spec cuda.GemmSpec, args cuda.GemmArgs) (bool, error) {
	return c.tryFusedWith(spec, args, c.gemm)
}

// tryFusedWith is tryFused running the GEMM through gemm: c.gemm, which
// sets the types from the engine's precision (the MLP's f32 Linear), or
// c.ltMatmul, which keeps the spec's own (the GEMM family).
func (c *cudaImpl) tryFusedWith(spec cuda.GemmSpec, args cuda.GemmArgs, gemm func(cuda.GemmSpec, cuda.GemmArgs) error) (bool, error) {
	if c.noFuse {
		return false, nil
	}
	st := exec.StateOf[fusedState](c.CUDA)
	if _, bad := st.rejected[spec]; bad {
		return false, nil
	}
	err := gemm(spec, args)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, cuda.ErrNoAlgorithm), errors.Is(err, cuda.BLASStatusNotSupported),
		errors.Is(err, cuda.BLASStatusInvalidValue):
		if st.rejected == nil {
			st.rejected = map[cuda.GemmSpec]error{}
		}
		st.rejected[spec] = err
		return false, nil
	}
	return false, err
}

// fusedState records the GEMM specs whose fused epilogue cuBLASLt refused
// on this device (no algorithm, or not supported for the types); they take
// the unfused path from then on without asking again.
type fusedState struct {
	rejected map[cuda.GemmSpec]error
}

// rejectedEpilogues lists the GEMMs whose fused epilogue cuBLASLt refused
// on this device (they run unfused), for diagnostics.
func (c *cudaImpl) rejectedEpilogues() map[cuda.GemmSpec]error {
	st := exec.StateOf[fusedState](c.CUDA)
	out := make(map[cuda.GemmSpec]error, len(st.rejected))
	for k, v := range st.rejected {
		out[k] = v
	}
	return out
}

func checkDims(dims ...int) error {
	for _, d := range dims {
		if d > math.MaxInt32 {
			return fmt.Errorf("%w: dimension %d exceeds the CUDA backend's int32 limit", tensor.ErrShape, d)
		}
	}
	return nil
}

// linear is Engine.Linear on CUDA (see the comment at the top of this file).
func (c *cudaImpl) linear(y, x, w, b, aux *tensor.Tensor, act Act) error {
	m, k, n := x.Shape[0], x.Shape[1], w.Shape[0]
	if err := checkDims(m, k, n); err != nil {
		return err
	}
	return c.Do(func() error {
		wp, xp := devPtr(w), devPtr(x)
		if c.prec == PrecBF16 {
			var err error
			if wp, err = c.castBF16("bf16_w", wp, int64(n*k)); err != nil {
				return err
			}
			if xp, err = c.castBF16("bf16_x", xp, int64(m*k)); err != nil {
				return err
			}
		}
		yp, bp, zp := devPtr(y), devPtr(b), devPtr(aux)
		var maskp cuda.DevicePtr // a u8 aux is the ReLU bit-mask, not z
		if aux != nil && aux.DType == tensor.U8 {
			maskp, zp = zp, 0
		}
		spec := cuda.GemmSpec{TransA: true, M: n, N: m, K: k, LDA: k, LDB: k, LDC: n, LDD: n}
		args := cuda.GemmArgs{A: wp, B: xp, D: yp, Bias: bp}

		spec.Epilogue = actEpilogue(act, b != nil)
		post := false // bias_act(y, aux, nil, act) after the fused GEMM
		switch {
		case maskp != 0:
			// RELU_AUX(_BIAS) on yᶜ (N×M): the mask has one bit per element
			// of D, ld in bits = ReLUMaskCols(N)·8 (a multiple of 128, ≥ N).
			spec.Epilogue, spec.AuxLD, args.Aux = cuda.EpilogueReLUAux, ReLUMaskCols(n)*8, maskp
			if b != nil {
				spec.Epilogue = cuda.EpilogueReLUAuxBias
			}
		case act == ActGELU && c.prec == PrecF32:
			spec.Epilogue = actEpilogue(ActNone, b != nil)
			post = true
		case zp != 0 && act == ActGELU:
			spec.Epilogue, spec.AuxLD, args.Aux = cuda.EpilogueGELUAux, n, zp
			if b != nil {
				spec.Epilogue = cuda.EpilogueGELUAuxBias
			}
		case zp != 0:
			spec.Epilogue = actEpilogue(ActNone, b != nil)
			post = true
		}
		if spec.Epilogue != cuda.EpilogueDefault {
			ok, err := c.tryFused(spec, args)
			if err != nil {
				return fmt.Errorf("ops: linear %dx%dx%d: %w", m, k, n, err)
			}
			if ok {
				if post {
					return c.biasAct(yp, zp, 0, act, m, n)
				}
				return nil
			}
		}
		spec.Epilogue, spec.AuxLD = cuda.EpilogueDefault, 0
		args.Bias, args.Aux = 0, 0
		if err := c.gemm(spec, args); err != nil {
			return fmt.Errorf("ops: linear %dx%dx%d: %w", m, k, n, err)
		}
		if b == nil && aux == nil && act == ActNone {
			return nil
		}
		if err := c.biasAct(yp, zp, bp, act, m, n); err != nil || maskp == 0 {
			return err
		}
		return c.reluMask(maskp, yp, m, n)
	})
}

// reluMask queues relu_mask: the ReLU bit-mask (ReLUMaskCols) of y[m,n] > 0
// into mask, for when cuBLASLt's RELU_AUX epilogue is not used.
func (c *cudaImpl) reluMask(mask, y cuda.DevicePtr, m, n int) error {
	ld := ReLUMaskCols(n)
	return launch.ReluMask(c, gridFor(int64(m)*int64(ld), 256), [3]uint32{256, 1, 1}, 0, mask, y, int64(m), int32(n), int32(ld))
}

// biasAct queues bias_act: z = y + b (b may be 0), aux = z (aux may be 0),
// y = act(z), over y[m,n].
func (c *cudaImpl) biasAct(y, aux, b cuda.DevicePtr, act Act, m, n int) error {
	total := int64(m) * int64(n)
	return launch.BiasAct(c, gridFor(total, 256), [3]uint32{256, 1, 1}, 0, y, aux, b, int64(m), int32(n), int32(act))
}

// colsumRows is the number of rows one block of act_bwd_colsum sums.
const colsumRows = 256

// actBwd queues act_bwd_colsum over dy[m,n]: dz = dy ⊙ act'(aux) stored at
// dz (unless dz is 0), and db[j] = Σ_i dz[i,j] (unless db is 0), summed
// per block of colsumRows rows and then by colsum_final in row-block order.
func (c *cudaImpl) actBwd(dz, dy, aux cuda.DevicePtr, act Act, m, n int, db cuda.DevicePtr) error {
	gy := (m + colsumRows - 1) / colsumRows
	partial := db
	if db != 0 && gy > 1 {
		var err error
		if partial, err = c.Scratch("colsum", int64(gy)*int64(n)*4); err != nil {
			return err
		}
	}
	grid := [3]uint32{uint32((n + 31) / 32), uint32(gy), 1}
	err := launch.ActBwdColsum(c, grid, [3]uint32{32, 8, 1}, 0,
		dz, dy, aux, partial, int32(m), int32(n), int32(act), int32(colsumRows))
	if err != nil || db == 0 || gy == 1 {
		return err
	}
	return launch.ColsumFinal(c, [3]uint32{uint32((n + 255) / 256), 1, 1}, [3]uint32{256, 1, 1}, 0,
		db, partial, int32(gy), int32(n))
}

// linearBackward is Engine.LinearBackward on CUDA (see the comment at the top of this file).
func (c *cudaImpl) linearBackward(dx, dw, db, dy, x, w, aux *tensor.Tensor, act Act) error {
	m, k, n := x.Shape[0], x.Shape[1], w.Shape[0]
	if err := checkDims(m, k, n); err != nil {
		return err
	}
	return c.Do(func() error {
		dbp := devPtr(db)
		fuseDB := db != nil && !c.noFuse
		colsumNow := db != nil && !fuseDB // db from the dz pass
		dz := devPtr(dy)
		switch {
		case act != ActNone:
			p, err := c.Scratch("dz", int64(m)*int64(n)*4)
			if err != nil {
				return err
			}
			target := cuda.DevicePtr(0)
			if colsumNow {
				target = dbp
			}
			if err := c.actBwd(p, dz, devPtr(aux), act, m, n, target); err != nil {
				return err
			}
			dz = p
		case colsumNow:
			if err := c.actBwd(0, dz, 0, ActNone, m, n, dbp); err != nil {
				return err
			}
		}

		dzB, wB, xB := dz, devPtr(w), devPtr(x)
		if c.prec == PrecBF16 {
			var err error
			if dzB, err = c.castBF16("bf16_dz", dz, int64(m)*int64(n)); err != nil {
				return err
			}
			if dx != nil {
				if wB, err = c.castBF16("bf16_w", wB, int64(n)*int64(k)); err != nil {
					return err
				}
			}
			if xB, err = c.castBF16("bf16_x", xB, int64(m)*int64(k)); err != nil {
				return err
			}
		}

		if dx != nil {
			spec := cuda.GemmSpec{M: k, N: m, K: n, LDA: k, LDB: n, LDC: k, LDD: k}
			if err := c.gemm(spec, cuda.GemmArgs{A: wB, B: dzB, D: devPtr(dx)}); err != nil {
				return fmt.Errorf("ops: linear backward dx %dx%dx%d: %w", m, k, n, err)
			}
		}

		spec := cuda.GemmSpec{TransB: true, M: k, N: n, K: m, LDA: k, LDB: n, LDC: k, LDD: k}
		args := cuda.GemmArgs{A: xB, B: dzB, D: devPtr(dw)}
		if fuseDB {
			spec.Epilogue, args.Bias = cuda.EpilogueBGradB, dbp
			ok, err := c.tryFused(spec, args)
			if err != nil {
				return fmt.Errorf("ops: linear backward dw %dx%dx%d: %w", m, k, n, err)
			}
			if ok {
				return nil
			}
			spec.Epilogue, args.Bias = cuda.EpilogueDefault, 0
			if err := c.actBwd(0, dz, 0, ActNone, m, n, dbp); err != nil {
				return err
			}
		}
		if err := c.gemm(spec, args); err != nil {
			return fmt.Errorf("ops: linear backward dw %dx%dx%d: %w", m, k, n, err)
		}
		return nil
	})
}
