package ops

// The GEMM family: (batched) matrix products with fused epilogues, on the
// host through gonum's Sgemm and on CUDA through cuBLASLt, with the
// element-wise fallbacks in libgpu/kernels/matmul.cu. Graph.Linear and
// Graph.Matmul record it on a tape. Reference and checks:
// opstest/matmul.go.

import (
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// Matmul is one matrix product, row-major (PyTorch's torch.matmul layout),
// batched over D's leading dimensions:
//
//	D[b] = act(op(A[b])·op(B[b]) + Bias)            (Accumulate false)
//	D[b] = D[b] + op(A[b])·op(B[b])                  (Accumulate true)
//
// op(X) is X, or Xᵀ when TransX. Shapes: op(A[b]) is M×K, op(B[b]) K×N,
// D[b] M×N. A and B are either of rank 2 (the same matrix for every batch
// item: a weight) or have D's batch dimensions; the batch dimensions of
// each operand must be mergeable into one (tensor.View) and the last
// dimension contiguous (row strides are free: views of a wider tensor work).
//
// Dtypes: A and B both f32 or both bf16; D, Bias, Aux and BiasGrad all of
// D's dtype (f32 or bf16). Accumulation is in f32: f32 operands compute in
// full f32 under PrecF32 and in TF32 otherwise; bf16 operands multiply
// exactly into f32 sums (cuBLASLt's CUBLAS_COMPUTE_32F).
//
// Epilogues (fused into the GEMM on CUDA where cuBLASLt can, else run as
// one element-wise pass after it; the host computes the same in f32):
//
//   - Bias [N]: added to every row of D.
//   - Act: ActReLU, or ActGELU (the tanh form; cuBLASLt's GELU epilogue).
//   - Aux (D's shape, contiguous; only with an Act): receives the
//     pre-activation z = op(A)·op(B) + Bias, which the backward needs.
//   - BiasGrad [M] (rank-2 operands only, TransA set): BiasGrad[m] =
//     Σ_k op(A)[m,k], the bias gradient of a linear layer computed by its
//     weight-gradient product dw = dyᵀ·x (cuBLASLt's BGRADB).
//
// Accumulate excludes Bias, Act and Aux (it adds a plain product); with
// BiasGrad, BiasGrad is accumulated too.
//
// Alpha and Beta scale a plain product (no Bias, Act, Aux or BiasGrad),
// as cuBLAS's alpha and beta do: D[b] = Alpha·op(A[b])·op(B[b]), and with
// Accumulate D[b] = Beta·D[b] + Alpha·op(A[b])·op(B[b]) (an exponential
// moving average of products in one GEMM). Zero means 1 for both (the
// zero value of Matmul is the unscaled product); Beta is read only with
// Accumulate. Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout, exec.ErrDevice or ErrConfig.
type Matmul struct {
	A, B, D        *tensor.Tensor
	TransA, TransB bool
	Bias           *tensor.Tensor
	Act            Act
	Aux            *tensor.Tensor
	BiasGrad       *tensor.Tensor
	Accumulate     bool
	Alpha, Beta    float32
	// FullF32 computes a product of f32 operands in full f32 even under
	// PrecTF32 (CUBLAS_COMPUTE_32F): for iterations that TF32's 10-bit
	// products make diverge (coupled Newton matrix roots, seen on an H100).
	FullF32 bool
}

// scales is the product's scale and, with Accumulate, the scale of D's old
// value (zero means 1 for both).
func (m *Matmul) scales() (alpha, beta float32) {
	alpha, beta = m.Alpha, m.Beta
	if alpha == 0 {
		alpha = 1
	}
	if beta == 0 {
		beta = 1
	}
	return alpha, beta
}

// mmShape is a validated Matmul's geometry: batch count, M, N, K, and
// per-operand leading dimension and batch stride (in elements).
type mmShape struct {
	batch, m, n, k int
	lda, ldb, ldd  int
	sa, sb, sd     int
	a, b, d        *tensor.Tensor // the operands viewed as [batch?, rows, cols]
}

// mat3 views x as [batch, rows, cols] (rank 2: batch 1, stride 0).
func mat3(what string, x *tensor.Tensor, batch int) (*tensor.Tensor, int, error) {
	r := x.Rank()
	if r < 2 {
		return nil, 0, fmt.Errorf("%w: matmul %s is %v, want rank ≥ 2", tensor.ErrShape, what, x.Shape)
	}
	if r == 2 {
		return x, 0, nil
	}
	v, err := x.View(-1, x.Shape[r-2], x.Shape[r-1])
	if err != nil {
		return nil, 0, fmt.Errorf("matmul %s: batch dimensions not mergeable: %w", what, err)
	}
	if v.Shape[0] != batch {
		return nil, 0, fmt.Errorf("%w: matmul %s has %d batch items, D has %d", tensor.ErrShape, what, v.Shape[0], batch)
	}
	if batch == 1 {
		return v, 0, nil
	}
	return v, v.Strides[0], nil
}

func (e *Engine) checkMatmul(m *Matmul) (mmShape, error) {
	var s mmShape
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
	}{{"A", m.A}, {"B", m.B}, {"D", m.D}} {
		if err := e.checkView("matmul "+c.what, c.t, false, floatTypes); err != nil {
			return s, err
		}
	}
	if m.A.DType != m.B.DType {
		return s, fmt.Errorf("%w: matmul A is %v, B is %v", tensor.ErrDType, m.A.DType, m.B.DType)
	}
	if err := checkAct(m.Act); err != nil {
		return s, err
	}
	rd := m.D.Rank()
	if rd < 2 {
		return s, fmt.Errorf("%w: matmul D is %v, want rank ≥ 2", tensor.ErrShape, m.D.Shape)
	}
	s.batch = tensor.Numel(m.D.Shape[:rd-2])
	s.m, s.n = m.D.Shape[rd-2], m.D.Shape[rd-1]
	var err error
	if s.d, s.sd, err = mat3("D", m.D, s.batch); err != nil {
		return s, err
	}
	if s.a, s.sa, err = mat3("A", m.A, s.batch); err != nil {
		return s, err
	}
	if s.b, s.sb, err = mat3("B", m.B, s.batch); err != nil {
		return s, err
	}
	ar, ac := s.a.Dim(-2), s.a.Dim(-1)
	br, bc := s.b.Dim(-2), s.b.Dim(-1)
	am, ak := ar, ac
	if m.TransA {
		am, ak = ac, ar
	}
	bk, bn := br, bc
	if m.TransB {
		bk, bn = bc, br
	}
	if am != s.m || bn != s.n || ak != bk {
		return s, fmt.Errorf("%w: matmul op(A) %d×%d · op(B) %d×%d into D %d×%d", tensor.ErrShape, am, ak, bk, bn, s.m, s.n)
	}
	s.k = ak
	s.lda, s.ldb, s.ldd = ldOf(s.a), ldOf(s.b), ldOf(s.d)
	if s.m == 0 || s.n == 0 {
		return s, nil
	}
	if m.Accumulate && (m.Bias != nil || m.Act != ActNone || m.Aux != nil) {
		return s, fmt.Errorf("%w: matmul Accumulate with a bias or activation epilogue", ErrConfig)
	}
	if alpha, beta := m.scales(); alpha != 1 || beta != 1 {
		if m.Bias != nil || m.Act != ActNone || m.Aux != nil || m.BiasGrad != nil {
			return s, fmt.Errorf("%w: matmul Alpha or Beta with an epilogue", ErrConfig)
		}
		if math.IsInf(float64(alpha), 0) || math.IsNaN(float64(alpha)) || math.IsInf(float64(beta), 0) || math.IsNaN(float64(beta)) {
			return s, fmt.Errorf("%w: matmul Alpha %v, Beta %v", ErrConfig, alpha, beta)
		}
	}
	if m.Bias != nil {
		if err := e.checkView("matmul Bias", m.Bias, true, []tensor.DType{m.D.DType}, s.n); err != nil {
			return s, err
		}
	}
	if m.Aux != nil {
		if m.Act == ActNone {
			return s, fmt.Errorf("%w: matmul Aux without an activation", ErrConfig)
		}
		if err := e.checkView("matmul Aux", m.Aux, true, []tensor.DType{m.D.DType}, m.D.Shape...); err != nil {
			return s, err
		}
	}
	if m.BiasGrad != nil {
		if s.batch != 1 || !m.TransA || m.A.Rank() != 2 {
			return s, fmt.Errorf("%w: matmul BiasGrad needs unbatched operands and TransA", ErrConfig)
		}
		if err := e.checkView("matmul BiasGrad", m.BiasGrad, true, []tensor.DType{m.D.DType}, s.m); err != nil {
			return s, err
		}
	}
	if err := checkDims(s.m, s.n, s.k, s.lda, s.ldb, s.ldd, s.batch); err != nil {
		return s, err
	}
	return s, nil
}

// ldOf is the row stride of a [.., rows, cols] view (cols when there is one row).
func ldOf(t *tensor.Tensor) int {
	if t.Dim(-2) <= 1 {
		return max(t.Dim(-1), 1)
	}
	return t.Strides[t.Rank()-2]
}

// Matmul runs one matrix product (see the type). K = 0 gives D = act(Bias)
// or leaves D unchanged with Accumulate.
func (e *Engine) Matmul(m Matmul) error {
	s, err := e.checkMatmul(&m)
	if err != nil {
		return err
	}
	if s.m == 0 || s.n == 0 || s.batch == 0 {
		return nil
	}
	return e.dispatch(func(h *hostImpl) error { return h.matmul(&m, &s) },
		func(c *cudaImpl) error { return c.matmul(&m, &s) })
}

// ---- host ----

func (h *hostImpl) matmul(m *Matmul, s *mmShape) error {
	ins, err := hostIns(s.a, s.b)
	if err != nil {
		return err
	}
	a, b := ins[0], ins[1]
	alpha, beta := m.scales()
	var old []float32 // D's values before a scaled accumulation
	if m.Accumulate && beta != 1 {
		if old, err = m.D.ReadFloat32(); err != nil {
			return err
		}
	}
	d, commit, err := hostOut(m.D, m.Accumulate && old == nil)
	if err != nil {
		return err
	}
	ta, tb := blas.NoTrans, blas.NoTrans
	if m.TransA {
		ta = blas.Trans
	}
	if m.TransB {
		tb = blas.Trans
	}
	// hostIn made row-major copies (or the contiguous originals): lda is
	// the stored column count, batch strides rows·cols or 0.
	acols, bcols := s.a.Dim(-1), s.b.Dim(-1)
	aStride, bStride := 0, 0
	if s.sa != 0 {
		aStride = s.a.Dim(-2) * acols
	}
	if s.sb != 0 {
		bStride = s.b.Dim(-2) * bcols
	}
	mn := s.m * s.n
	for i := 0; i < s.batch; i++ {
		out := d[i*mn : (i+1)*mn]
		if s.k == 0 {
			clear(out)
			continue
		}
		h.blas.Sgemm(ta, tb, s.m, s.n, s.k, alpha, a[i*aStride:], max(acols, 1), b[i*bStride:], max(bcols, 1), 0, out, s.n)
	}
	for i, v := range old {
		d[i] += beta * v
	}
	if m.Bias != nil || m.Act != ActNone {
		bias, err := hostIn(m.Bias)
		if err != nil {
			return err
		}
		aux, auxCommit, err := hostOut(m.Aux, false)
		if err != nil {
			return err
		}
		for i := range d {
			z := d[i]
			if bias != nil {
				z += bias[i%s.n]
			}
			if aux != nil {
				aux[i] = z
			}
			d[i] = hostAct(z, m.Act)
		}
		if err := auxCommit(); err != nil {
			return err
		}
	}
	if m.BiasGrad != nil {
		// op(A) = Aᵀ: A is stored K×M; BiasGrad[j] = Σ_r A[r, j].
		g, gCommit, err := hostOut(m.BiasGrad, m.Accumulate)
		if err != nil {
			return err
		}
		clear(g)
		for r := 0; r < s.k; r++ {
			row := a[r*acols : (r+1)*acols]
			for j := range g {
				g[j] += row[j]
			}
		}
		if err := gCommit(); err != nil {
			return err
		}
	}
	return commit()
}

// hostAct applies act to z (GELU in its tanh form, as the epilogue).
func hostAct(z float32, act Act) float32 {
	switch act {
	case ActReLU:
		return max(z, 0)
	case ActGELU:
		return geluF(z)
	}
	return z
}

// ---- CUDA ----

// ltType is the cuBLASLt data type of a float dtype.
func ltType(dt tensor.DType) cuda.DataType {
	if dt == tensor.BF16 {
		return cuda.R16BF
	}
	return cuda.R32F
}

// matmul maps the row-major product onto cuBLASLt's column-major one:
// a row-major X[r,c] with row stride ld is the column-major Xᵀ (c×r, ld).
// D = op(A)·op(B) ⇔ Dᵀ = op(B)ᵀ·op(A)ᵀ, so cuBLASLt's A is our B (its
// transpose flag ours), its B our A, its m, n our N, M; D's row stride is
// its ldd. Bias per column of our D is per row of cuBLASLt's D (its BIAS
// epilogues), and BiasGrad per row of our D is per column of its D reduced
// over k of its B = our A (BGRADB).
func (c *cudaImpl) matmul(m *Matmul, s *mmShape) error {
	spec := cuda.GemmSpec{
		TransA: m.TransB, TransB: m.TransA,
		M: s.n, N: s.m, K: s.k,
		LDA: s.ldb, LDB: s.lda, LDC: s.ldd, LDD: s.ldd,
		Batch:   s.batch,
		StrideA: int64(s.sb), StrideB: int64(s.sa), StrideC: int64(s.sd), StrideD: int64(s.sd),
		AType: ltType(m.A.DType), BType: ltType(m.B.DType),
		CType: ltType(m.D.DType), DType: ltType(m.D.DType),
		Compute: cuda.Compute32F,
	}
	if m.A.DType == tensor.F32 && c.prec != PrecF32 && !m.FullF32 {
		spec.Compute = cuda.Compute32FFastTF32
	}
	ws, wsSize, err := c.Workspace()
	if err != nil {
		return err
	}
	alpha, beta := m.scales()
	args := cuda.GemmArgs{A: devPtr(s.b), B: devPtr(s.a), D: devPtr(s.d), Alpha: alpha,
		Workspace: ws, WorkspaceSize: wsSize}
	if m.Accumulate {
		args.C, args.Beta = args.D, beta
	}
	if s.k == 0 {
		return c.matmulEmptyK(m, s)
	}
	// The fused form, unless fusion is off or the tanh of cuBLASLt's GELU
	// epilogue would fall short of PrecF32's promise (see cuda_linear.go).
	hasBias, hasAux, hasGrad := m.Bias != nil, m.Aux != nil, m.BiasGrad != nil
	fusable := !(m.Act == ActGELU && spec.Compute == cuda.Compute32F && m.D.DType == tensor.F32)
	if hasAux && m.Act == ActReLU {
		fusable = false // cuBLASLt's ReLU aux is a bit-mask, not z
	}
	if hasGrad && m.Accumulate {
		fusable = false // BGRADB writes the bias gradient, it does not add
	}
	if fusable && (hasBias || m.Act != ActNone || hasGrad) {
		fs, fa := spec, args
		switch {
		case hasGrad:
			fs.Epilogue, fa.Bias = cuda.EpilogueBGradB, devPtr(m.BiasGrad)
		case hasAux:
			fs.Epilogue, fs.AuxLD, fa.Aux = cuda.EpilogueGELUAux, s.n, devPtr(m.Aux)
			if hasBias {
				fs.Epilogue = cuda.EpilogueGELUAuxBias
			}
		default:
			fs.Epilogue = actEpilogue(m.Act, hasBias)
		}
		if hasBias {
			fa.Bias = devPtr(m.Bias)
		}
		ok, err := c.tryFusedWith(fs, fa, c.ltMatmul)
		if err != nil || ok {
			return err
		}
	}
	// Unfused: the plain product, then the element-wise epilogue.
	if err := c.ltMatmul(spec, args); err != nil {
		return fmt.Errorf("ops: matmul %d×%d×%d (batch %d): %w", s.m, s.n, s.k, s.batch, err)
	}
	if hasBias || m.Act != ActNone {
		if err := c.mmBiasAct(m.D.DType, devPtr(s.d), devPtr(m.Aux), devPtr(m.Bias), int64(s.batch*s.m), s.n, s.ldd, m.Act, s); err != nil {
			return err
		}
	}
	if hasGrad {
		return c.mmColsum(m.D.DType, devPtr(m.BiasGrad), devPtr(s.a), int64(s.k), s.m, s.lda, m.Accumulate)
	}
	return nil
}

// ltMatmul runs a GEMM exactly as specified on the backend's stream, with
// the algorithm timed for its spec (gemmtune.go).
func (c *cudaImpl) ltMatmul(spec cuda.GemmSpec, args cuda.GemmArgs) error {
	if err := c.tune(spec, args); err != nil {
		return err
	}
	return c.Lt().Matmul(spec, args, c.Stream())
}

// matmulEmptyK handles K = 0: the product is zero.
func (c *cudaImpl) matmulEmptyK(m *Matmul, s *mmShape) error {
	if _, beta := m.scales(); m.Accumulate && beta == 1 {
		return nil
	}
	return errors.New("ops: matmul with K = 0 on CUDA is not supported (give the layer at least one input)")
}

// mmBiasAct launches mm_bias_act_<dt> over rows × cols of d (row stride
// ld): z = d + bias; aux = z (when aux ≠ 0); d = act(z). For a batched D
// the rows of all batch items must be evenly strided (ld·m per item).
func (c *cudaImpl) mmBiasAct(dt tensor.DType, d, aux, bias cuda.DevicePtr, rows int64, cols, ld int, act Act, s *mmShape) error {
	if s.batch > 1 && s.sd != s.m*ld {
		return fmt.Errorf("%w: matmul epilogue on a batched D with gaps between items", tensor.ErrLayout)
	}
	n := int(min(int64(cols)*rows/256+1, 65535))
	return launch.MmBiasAct(c, dtName(dt), grid1(n), block1(256), 0, d, aux, bias, rows, int32(cols), int64(ld), int32(act))
}

// mmColsum launches mm_colsum_<dt>: out[j] (+)= Σ_r a[r*lda + j].
func (c *cudaImpl) mmColsum(dt tensor.DType, out, a cuda.DevicePtr, rows int64, cols, lda int, acc bool) error {
	return launch.MmColsum(c, dtName(dt), grid1((cols+31)/32), [3]uint32{32, 8, 1}, 0,
		out, a, rows, int32(cols), int64(lda), launch.Bool(acc))
}

// ---- graph ----

// Linear records y = act(x·wᵀ + b), PyTorch's nn.Linear (weight [out, in],
// bias [out]) followed by an optional activation: x [..., in] (any leading
// dimensions, rows contiguous), y [..., out] in the graph's activation
// dtype. b may be nil. Under bf16 autocast w and b are used through bf16
// copies made once per step (Graph.Cast) whose gradients land in the f32
// masters. ActGELU here is the tanh form fused into the GEMM; for the erf
// form record Linear without an activation and Graph.GELU after it.
func (g *Graph) Linear(x, w, b *Var, act Act) *Var {
	if !g.ok(x, w) {
		return nil
	}
	if w.Value.Rank() != 2 || x.Value.Rank() < 1 || x.Value.Dim(-1) != w.Value.Dim(1) {
		g.Fail("linear", fmt.Errorf("%w: x %v, w %v", tensor.ErrShape, x.Value.Shape, w.Value.Shape))
		return nil
	}
	dt := g.ActDType()
	if act != ActNone || b != nil {
		// The activation's backward, a bias gradient the GEMM does not
		// fuse, an epilogue cuBLASLt refuses.
		g.prefetch("matmul.cu")
	}
	weight, onLinear := w.Name, g.opts.OnLinear
	x = g.Cast(x, dt)
	w = g.Cast(w, dt)
	if b != nil {
		b = g.Cast(b, dt)
	}
	in := []*Var{x, w}
	if b != nil {
		in = append(in, b)
	}
	k, n := w.Value.Dim(1), w.Value.Dim(0)
	shape := append(append([]int(nil), x.Value.Shape[:x.Value.Rank()-1]...), n)
	y := g.NewOut("linear", dt, shape...)
	var z *Var // the pre-activation, saved for GELU's backward (ReLU's reads y: [z > 0] = [y > 0])
	if act == ActGELU {
		z = g.NewOut("linear.pre", dt, shape...)
	}
	if !g.ok(y) {
		return nil
	}
	x2, err := x.Value.View(-1, k)
	if err != nil {
		g.Fail("linear", err)
		return nil
	}
	y2, _ := y.Value.View(-1, n)
	out := []*Var{y}
	if z != nil {
		out = append(out, z)
	}
	e := g.e
	g.Record("linear", in, out, func(*Grads) error {
		mm := Matmul{A: x2, B: w.Value, D: y2, TransB: true, Act: act}
		if b != nil {
			mm.Bias = b.Value
		}
		if z != nil {
			mm.Aux, _ = z.Value.View(-1, n)
		}
		return e.Matmul(mm)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil {
			return nil
		}
		dz, err := dy.View(-1, n)
		if err != nil {
			return err
		}
		if act != ActNone {
			// dz = dy ⊙ act'(z), into y's gradient buffer (y's gradient
			// is not read after this node).
			saved := y.Value
			if z != nil {
				saved = z.Value
			}
			z2, _ := saved.View(-1, n)
			if err := e.ActBackward(dz, dz, z2, act); err != nil {
				return err
			}
		}
		if onLinear != nil {
			if err := onLinear(weight, x2, dz); err != nil {
				return fmt.Errorf("OnLinear(%s): %w", weight, err)
			}
		}
		if dx := gr.In(0); dx != nil {
			dx2, err := dx.View(-1, k)
			if err != nil {
				return err
			}
			if err := e.Matmul(Matmul{A: dz, B: w.Value, D: dx2, Accumulate: gr.Acc(0)}); err != nil {
				return err
			}
		}
		mm := Matmul{A: dz, B: x2, D: gr.In(1), TransA: true, Accumulate: gr.Acc(1)}
		side := e.HasSide() && gr.Sole(1) && (b == nil || gr.In(2) == nil || gr.Sole(2))
		if b != nil && gr.In(2) != nil {
			if mm.D != nil && gr.Acc(2) == gr.Acc(1) {
				mm.BiasGrad = gr.In(2) // from the weight-gradient product (BGRADB)
			} else if err := e.ColumnSum(gr.In(2), dz, gr.Acc(2)); err != nil {
				return err
			}
		}
		if mm.D == nil {
			return nil
		}
		if side {
			// The weight gradient (a product over all the batch's rows
			// into a small matrix, which fills few multiprocessors) runs
			// on the side stream beside the rest of the backward; this
			// node is its only writer and Graph.Backward joins before
			// anything reads it.
			g.shared.side = true
			return e.Side(func() error { return e.Matmul(mm) })
		}
		return e.Matmul(mm)
	})
	return y
}

// Matmul records the batched product y = a·op(b) (transB: b transposed),
// a [..., M, K], b [..., K, N] (or [..., N, K] with transB) of the same
// batch dimensions, in the graph's activation dtype (inputs are cast).
func (g *Graph) Matmul(a, b *Var, transB bool) *Var {
	if !g.ok(a, b) {
		return nil
	}
	dt := g.ActDType()
	a, b = g.Cast(a, dt), g.Cast(b, dt)
	if !g.ok(a, b) {
		return nil
	}
	r := a.Value.Rank()
	if r < 2 || b.Value.Rank() != r {
		g.Fail("matmul", fmt.Errorf("%w: a %v, b %v", tensor.ErrShape, a.Value.Shape, b.Value.Shape))
		return nil
	}
	n := b.Value.Dim(-1)
	if transB {
		n = b.Value.Dim(-2)
	}
	shape := append(append([]int(nil), a.Value.Shape[:r-1]...), n)
	y := g.NewOut("matmul", dt, shape...)
	e := g.e
	g.Record("matmul", []*Var{a, b}, []*Var{y}, func(*Grads) error {
		return e.Matmul(Matmul{A: a.Value, B: b.Value, D: y.Value, TransB: transB})
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil {
			return nil
		}
		// da = dy·op(b)ᵀ; db = aᵀ·dy (or dyᵀ·a with transB).
		if da := gr.In(0); da != nil {
			if err := e.Matmul(Matmul{A: dy, B: b.Value, D: da, TransB: !transB, Accumulate: gr.Acc(0)}); err != nil {
				return err
			}
		}
		if db := gr.In(1); db != nil {
			mm := Matmul{A: a.Value, B: dy, D: db, TransA: true, Accumulate: gr.Acc(1)}
			if transB {
				mm = Matmul{A: dy, B: a.Value, D: db, TransA: true, Accumulate: gr.Acc(1)}
			}
			return e.Matmul(mm)
		}
		return nil
	})
	return y
}

// ActBackward computes dz = dy ⊙ act'(z) element-wise for ActReLU and
// ActGELU (tanh form) over tensors of one shape and dtype (dz may be dy).
// For ReLU, z may be the activation's output y ([z > 0] = [y > 0]).
// Rows may be strided; the last dimension must be contiguous.
func (e *Engine) ActBackward(dz, dy, z *tensor.Tensor, act Act) error {
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
	}{{"dz", dz}, {"dy", dy}, {"z", z}} {
		if err := e.checkView("act backward "+c.what, c.t, true, floatTypes); err != nil {
			return err
		}
	}
	if err := sameShapes("act backward", dz, dy, z); err != nil {
		return err
	}
	if dz.DType != dy.DType || dz.DType != z.DType {
		return fmt.Errorf("%w: act backward dtypes %v %v %v", tensor.ErrDType, dz.DType, dy.DType, z.DType)
	}
	if act != ActReLU && act != ActGELU {
		return fmt.Errorf("%w: act backward of %v", ErrConfig, act)
	}
	n := dz.Numel()
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		ins, err := hostIns(dy, z)
		if err != nil {
			return err
		}
		gy, zz := ins[0], ins[1]
		out, commit, err := hostOut(dz, false)
		if err != nil {
			return err
		}
		for i := range out {
			d := float32(0)
			switch act {
			case ActReLU:
				if zz[i] > 0 {
					d = gy[i]
				}
			case ActGELU:
				d = gy[i] * geluGrad(zz[i])
			}
			out[i] = d
		}
		return commit()
	}, func(c *cudaImpl) error {
		blocks := int(min(int64(n)/256+1, 65535))
		return launch.MmActBwd(c, dtName(dz.DType), grid1(blocks), block1(256), 0,
			devPtr(dz), devPtr(dy), devPtr(z), int64(n), int32(act))
	})
}

// ColumnSum computes out[j] (+)= Σ_i x[i, j] for x [rows, cols] (rows may
// be strided) and out [cols] of x's dtype: a bias gradient.
func (e *Engine) ColumnSum(out, x *tensor.Tensor, acc bool) error {
	if err := e.checkView("column sum x", x, false, floatTypes); err != nil {
		return err
	}
	if x.Rank() != 2 {
		return fmt.Errorf("%w: column sum of %v, want a matrix", tensor.ErrShape, x.Shape)
	}
	if err := e.checkView("column sum out", out, true, []tensor.DType{x.DType}, x.Dim(1)); err != nil {
		return err
	}
	if x.Numel() == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		v, err := hostIn(x)
		if err != nil {
			return err
		}
		o, commit, err := hostOut(out, acc)
		if err != nil {
			return err
		}
		cols := x.Dim(1)
		sums := make([]float64, cols)
		for i, a := range v {
			sums[i%cols] += float64(a)
		}
		for j := range o {
			o[j] = float32(sums[j])
		}
		return commit()
	}, func(c *cudaImpl) error {
		return c.mmColsum(x.DType, devPtr(out), devPtr(x), int64(x.Dim(0)), x.Dim(1), ldOf(x), acc)
	})
}
