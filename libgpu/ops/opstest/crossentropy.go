package opstest

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "crossentropy", Check: checkCrossEntropy}) }

// RefCrossEntropy is the float64 reference of ops.CrossEntropy for logits
// x [n, v] row-major: each row's loss log Σ_j exp(x_ij) − x_{i,t_i} (by
// log-sum-exp with the row maximum subtracted; 0 for t_i < 0), their mean
// over the n_valid rows with t_i ≥ 0 (0 when there are none), and its
// gradient (softmax − onehot)/n_valid (0 on ignored rows).
func RefCrossEntropy(x []float64, t []int32, n, v int) (rows []float64, mean float64, grad []float64) {
	rows, grad = make([]float64, n), make([]float64, n*v)
	valid := validRows(t)
	for i := 0; i < n; i++ {
		if t[i] < 0 {
			continue
		}
		row := x[i*v : (i+1)*v]
		mx := slices.Max(row)
		var s float64
		for _, a := range row {
			s += math.Exp(a - mx)
		}
		lse := mx + math.Log(s)
		rows[i] = lse - row[t[i]]
		mean += rows[i]
		for j, a := range row {
			grad[i*v+j] = math.Exp(a-lse) / float64(valid)
		}
		grad[i*v+int(t[i])] -= 1 / float64(valid)
	}
	if valid > 0 {
		mean /= float64(valid)
	}
	return rows, mean, grad
}

// validRows counts the targets t_i ≥ 0 (a negative one is ignored).
func validRows(t []int32) int {
	n := 0
	for _, ti := range t {
		if ti >= 0 {
			n++
		}
	}
	return n
}

// RefCrossEntropyTerms is the terms' size (TermsErr) of RefCrossEntropy's
// results: a row's stable log-sum-exp sums exp(x − max), which includes
// the maximum's own 1, so it is known to the precision of 1, and the
// row's loss adds |x_t − max| (0 for an ignored row); the mean's terms
// are the rows' averaged; the gradient (p − onehot)/n_valid sums p and
// the one-hot.
func RefCrossEntropyTerms(x []float64, t []int32, n, v int) (rows []float64, mean float64, grad []float64) {
	_, _, g := RefCrossEntropy(x, t, n, v)
	rows, grad = make([]float64, n), Abs(g)
	valid := validRows(t)
	for i := 0; i < n; i++ {
		if t[i] < 0 {
			continue
		}
		row := x[i*v : (i+1)*v]
		mx := slices.Max(row)
		rows[i] = 1 + math.Abs(row[t[i]]-mx)
		mean += rows[i]
		grad[i*v+int(t[i])] += 2 / float64(valid)
	}
	if valid > 0 {
		mean /= float64(valid)
	}
	return rows, mean, grad
}

// Targets draws n targets in [0, v), each ignored (−1, or another
// negative value) with probability pIgnore.
func (s *Suite) Targets(n, v int, pIgnore float64) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(s.R.IntN(v))
		if s.R.Float64() < pIgnore {
			t[i] = -1 - int32(s.R.IntN(3))
		}
	}
	return t
}

// LossCase describes a check of a loss node (a Graph method recorded with
// RecordLoss, whose forward writes its inputs' gradients): the loss
// against a float64 reference, and every parameter's gradient after
// Forward and Backward against central finite differences of the
// reference loss. GradCheck cannot serve: it roots the backward in a
// DotLoss node, which cannot consume a loss.
type LossCase struct {
	Name  string
	DType tensor.DType // dtype of the params and the graph's autocast
	// Params are the shapes of the differentiable inputs, drawn from
	// N(0, Scale²) (Scale 0: 1).
	Params [][]int
	Scale  float64
	// Consts are inputs without gradients (targets).
	Consts []*tensor.Tensor
	// Record records the loss on g and returns the loss Var(s); the
	// gradients are of their sum.
	Record func(g *ops.Graph, p, c []*ops.Var) []*ops.Var
	// Ref is the float64 reference of the summed loss.
	Ref func(p [][]float64) float64
	// TolF bounds the loss error relative to max(|loss|, 1); TolB the
	// gradients' relative error (0: Tol(DType) and 10× that). H is the
	// finite difference step (0: 1e-3, relative to max(1, |x|)).
	TolF, TolB, H float64
}

// LossGradCheck runs c with the loss poisoned first.
func (s *Suite) LossGradCheck(c LossCase) {
	s.T.Helper()
	tolF, tolB, h, scale := c.TolF, c.TolB, c.H, c.Scale
	if tolF == 0 {
		tolF = s.Tol(c.DType)
	}
	if tolB == 0 {
		tolB = 10 * tolF
	}
	if h == 0 {
		h = 1e-3
	}
	if scale == 0 {
		scale = 1
	}
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Autocast: c.DType})
	defer g.Free()
	vals := make([][]float64, len(c.Params))
	pv := make([]*ops.Var, len(c.Params))
	for i, shape := range c.Params {
		var t *tensor.Tensor
		t, vals[i] = s.Rand(c.DType, scale, shape...)
		pv[i] = g.Param(fmt.Sprintf("p%d", i), t, s.Empty(c.DType, shape...))
	}
	cv := make([]*ops.Var, len(c.Consts))
	for i, t := range c.Consts {
		cv[i] = g.Input(fmt.Sprintf("c%d", i), t)
	}
	losses := c.Record(g, pv, cv)
	if g.Err() != nil || len(losses) == 0 {
		s.T.Fatalf("%s: record: %v", c.Name, g.Err())
	}
	s.NoErr(c.Name+": build", g.Build(true))
	for _, l := range losses {
		s.NoErr("poison", Poison(l.Value))
	}
	s.NoErr(c.Name+": forward", g.Forward())
	var got float64
	for _, l := range losses {
		got += s.Read(l.Value)[0]
	}
	want := c.Ref(vals)
	// The losses' log-sum-exps are known to the precision of 1 (their sums
	// include the maximum's own 1: RefCrossEntropyTerms).
	s.Close(c.Name+" loss", []float64{got}, []float64{want}, []float64{1}, tolF)
	s.NoErr(c.Name+": backward", g.Backward())
	for i := range c.Params {
		fd := make([]float64, len(vals[i]))
		x := append([]float64(nil), vals[i]...)
		for j := range x {
			old := x[j]
			hj := h * math.Max(1, math.Abs(old))
			eval := func(v float64) float64 {
				x[j] = v
				saved := vals[i]
				vals[i] = x
				defer func() { vals[i] = saved }()
				return c.Ref(vals)
			}
			fd[j] = (eval(old+hj) - eval(old-hj)) / (2 * hj)
			x[j] = old
		}
		s.Close(fmt.Sprintf("%s gradient of input %d", c.Name, i), s.Read(pv[i].Grad), fd, nil, tolB)
	}
}

func checkCrossEntropy(s *Suite) {
	for _, xdt := range s.DTypes() {
		for _, gdt := range s.DTypes() {
			for _, v := range []int{1, 7, 65, 1000, 1031, 4099} {
				s.Run(fmt.Sprintf("logits=%v,dlogits=%v/V=%d", xdt, gdt, v), func(s *Suite) {
					xentCase(s, xdt, gdt, 13, v, 0.25, 2, 0, false)
				})
			}
		}
		s.Run(fmt.Sprintf("%v/V=50257", xdt), func(s *Suite) { xentCase(s, xdt, xdt, 3, 50257, 0, 2, 0, false) })
		s.Run(fmt.Sprintf("%v/scale=30", xdt), func(s *Suite) { xentCase(s, xdt, xdt, 9, 1500, 0.2, 30, 0, false) })
		s.Run(fmt.Sprintf("%v/shift=1000", xdt), func(s *Suite) { xentCase(s, xdt, xdt, 9, 77, 0.2, 1, 1000, false) })
		s.Run(fmt.Sprintf("%v/all-ignored", xdt), func(s *Suite) {
			xentCase(s, xdt, xdt, 5, 70, 1, 1, 0, false)
			xentCase(s, xdt, xdt, 5, 1100, 1, 1, 0, true)
		})
		s.Run(fmt.Sprintf("%v/accumulate", xdt), func(s *Suite) {
			xentCase(s, xdt, xdt, 11, 40, 0.3, 2, 0, true)
			xentCase(s, xdt, xdt, 6, 2000, 0.3, 2, 0, true)
		})
		s.Run(fmt.Sprintf("%v/strided", xdt), func(s *Suite) {
			xentStrided(s, xdt, 7, 33)
			xentStrided(s, xdt, 7, 1037)
		})
		s.Run(fmt.Sprintf("%v/rank3-loss-only-rows", xdt), func(s *Suite) { xentRank3(s, xdt) })
		s.Run(fmt.Sprintf("%v/in-place", xdt), func(s *Suite) {
			xentInPlace(s, xdt, 9, 65)
			xentInPlace(s, xdt, 5, 3001)
		})
		s.Run(fmt.Sprintf("%v/grad", xdt), func(s *Suite) { xentGrad(s, xdt) })
	}
	s.Run("bad-target", xentBadTarget)
	s.Run("validation", xentValidation)
}

// xentCase runs CrossEntropy on n rows of v logits drawn from
// N(shift, scale²), a fraction pIgnore of the targets ignored, the loss
// and gradient poisoned first (or the gradient random and accumulated
// into, with acc).
func xentCase(s *Suite, xdt, gdt tensor.DType, n, v int, pIgnore, scale, shift float64, acc bool) {
	x := s.Empty(xdt, n, v)
	xv := make([]float64, n*v)
	for i := range xv {
		xv[i] = shift + scale*s.R.NormFloat64()
	}
	s.NoErr("write", x.WriteFloat32(F32(xv)))
	xf, err := x.ReadFloat32()
	s.NoErr("read", err)
	xv = F64(xf)
	tg := s.Targets(n, v, pIgnore)
	targets := UploadI32(s.T, s.A, tg, n)
	loss := s.Empty(tensor.F32, 1)
	var dl *tensor.Tensor
	var old []float64
	if acc {
		dl, old = s.Rand(gdt, 1, n, v)
	} else {
		dl = s.Empty(gdt, n, v)
	}
	s.NoErr("cross-entropy", s.E.CrossEntropy(loss, dl, x, targets, acc))
	_, mean, grad := RefCrossEntropy(xv, tg, n, v)
	_, tmean, tgrad := RefCrossEntropyTerms(xv, tg, n, v)
	s.Close("loss", s.Read(loss), []float64{mean}, []float64{tmean}, 1e-5)
	if acc {
		for i := range grad {
			grad[i] += old[i]
		}
		tgrad = Sum(tgrad, old)
	}
	s.Close("dlogits", s.Read(dl), grad, tgrad, s.Tol(gdt))
}

// xentStrided: logits and dlogits are column blocks of wider tensors
// (row strides v+5 and v+3, so rows start at every alignment); elements
// outside dlogits' view stay untouched.
func xentStrided(s *Suite, xdt tensor.DType, n, v int) {
	wide, wv := s.Rand(xdt, 2, n, v+5)
	x, err := wide.Narrow(1, 1, v)
	s.NoErr("narrow", err)
	xv := make([]float64, 0, n*v)
	for r := 0; r < n; r++ {
		xv = append(xv, wv[r*(v+5)+1:r*(v+5)+1+v]...)
	}
	tg := s.Targets(n, v, 0.2)
	targets := UploadI32(s.T, s.A, tg, n)
	dwide := s.Empty(xdt, n, v+3)
	dl, err := dwide.Narrow(1, 2, v)
	s.NoErr("narrow", err)
	loss := s.Empty(tensor.F32, 1)
	s.NoErr("cross-entropy", s.E.CrossEntropy(loss, dl, x, targets, false))
	_, mean, grad := RefCrossEntropy(xv, tg, n, v)
	_, tmean, tgrad := RefCrossEntropyTerms(xv, tg, n, v)
	s.Close("loss (strided)", s.Read(loss), []float64{mean}, []float64{tmean}, 1e-5)
	s.Close("dlogits (strided)", s.Read(dl), grad, tgrad, s.Tol(xdt))
	all := s.Read(dwide)
	for r := 0; r < n; r++ {
		for j := 0; j < v+3; j++ {
			if (j < 2 || j >= 2+v) && !math.IsNaN(all[r*(v+3)+j]) {
				s.T.Fatalf("dlogits element [%d,%d] outside the view was written", r, j)
			}
		}
	}
}

// xentInPlace: dlogits is logits itself (the gradient overwrites them).
func xentInPlace(s *Suite, dt tensor.DType, n, v int) {
	x, xv := s.Rand(dt, 2, n, v)
	tg := s.Targets(n, v, 0.2)
	targets := UploadI32(s.T, s.A, tg, n)
	loss := s.Empty(tensor.F32, 1)
	s.NoErr("cross-entropy", s.E.CrossEntropy(loss, x, x, targets, false))
	_, mean, grad := RefCrossEntropy(xv, tg, n, v)
	_, tmean, tgrad := RefCrossEntropyTerms(xv, tg, n, v)
	s.Close("loss (in place)", s.Read(loss), []float64{mean}, []float64{tmean}, 1e-5)
	s.Close("dlogits (in place)", s.Read(x), grad, tgrad, s.Tol(dt))
}

// xentRank3: logits [B, T, V] with targets [B, T], the loss alone
// (dlogits nil), and CrossEntropyRows.
func xentRank3(s *Suite, xdt tensor.DType) {
	const b, t = 2, 5
	for _, v := range []int{65, 1200} {
		x, xv := s.Rand(xdt, 2, b, t, v)
		tg := s.Targets(b*t, v, 0.3)
		targets := UploadI32(s.T, s.A, tg, b, t)
		loss := s.Empty(tensor.F32, 1)
		s.NoErr("cross-entropy", s.E.CrossEntropy(loss, nil, x, targets, false))
		rows, mean, _ := RefCrossEntropy(xv, tg, b*t, v)
		trows, tmean, _ := RefCrossEntropyTerms(xv, tg, b*t, v)
		s.Close("loss (no gradient)", s.Read(loss), []float64{mean}, []float64{tmean}, 1e-5)
		rl := s.Empty(tensor.F32, b, t)
		s.NoErr("cross-entropy rows", s.E.CrossEntropyRows(rl, x, targets))
		s.Close("row losses", s.Read(rl), rows, trows, 1e-5)
	}
}

// xentGrad checks Graph.CrossEntropy against finite differences: on a
// logits param; behind a linear layer (the gradient flows on through the
// tape); and twice on the same logits (the second loss node accumulates).
func xentGrad(s *Suite, dt tensor.DType) {
	tolB := 1e-3
	if dt == tensor.BF16 {
		tolB = 5e-2
	}
	for _, sh := range [][2]int{{4, 6}, {2, 1030}} {
		n, v := sh[0], sh[1]
		tg := s.Targets(n, v, 0.25)
		tg[0] = 1 // at least one valid row
		targets := UploadI32(s.T, s.A, tg, n)
		s.LossGradCheck(LossCase{
			Name: fmt.Sprintf("cross-entropy V=%d", v), DType: dt, Params: [][]int{{n, v}}, Scale: 2,
			Consts: []*tensor.Tensor{targets}, TolF: 1e-5, TolB: tolB,
			Record: func(g *ops.Graph, p, c []*ops.Var) []*ops.Var {
				return []*ops.Var{g.CrossEntropy(p[0], c[0])}
			},
			Ref: func(p [][]float64) float64 { _, l, _ := RefCrossEntropy(p[0], tg, n, v); return l },
		})
	}
	const n, k, v = 6, 5, 9
	tg := s.Targets(n, v, 0.2)
	tg[0] = 2
	tg2 := s.Targets(n, v, 0.2)
	targets, targets2 := UploadI32(s.T, s.A, tg, 2, 3), UploadI32(s.T, s.A, tg2, 2, 3)
	tolF := s.GemmTol(tensor.F32) // the logits are a GEMM's (TF32 under PrecTF32)
	if dt == tensor.BF16 {
		tolF = 2e-2 // the logits themselves are bf16 GEMM results
	}
	s.LossGradCheck(LossCase{
		Name: "linear → cross-entropy", DType: dt, Params: [][]int{{2, 3, k}, {v, k}},
		Consts: []*tensor.Tensor{targets}, TolF: tolF, TolB: max(tolB, 10*tolF),
		Record: func(g *ops.Graph, p, c []*ops.Var) []*ops.Var {
			return []*ops.Var{g.CrossEntropy(g.Linear(p[0], p[1], nil, ops.ActNone), c[0])}
		},
		Ref: func(p [][]float64) float64 {
			_, l, _ := RefCrossEntropy(RefMatmul(p[0], p[1], n, v, k, false, true), tg, n, v)
			return l
		},
	})
	s.LossGradCheck(LossCase{
		Name: "cross-entropy twice", DType: dt, Params: [][]int{{2, 3, v}},
		Consts: []*tensor.Tensor{targets, targets2}, TolF: 1e-5, TolB: tolB,
		Record: func(g *ops.Graph, p, c []*ops.Var) []*ops.Var {
			return []*ops.Var{g.CrossEntropy(p[0], c[0]), g.CrossEntropy(p[0], c[1])}
		},
		Ref: func(p [][]float64) float64 {
			_, a, _ := RefCrossEntropy(p[0], tg, n, v)
			_, b, _ := RefCrossEntropy(p[0], tg2, n, v)
			return a + b
		},
	})
}

func xentBadTarget(s *Suite) {
	for _, v := range []int{7, 1100} {
		x, _ := s.Rand(tensor.F32, 1, 3, v)
		targets := UploadI32(s.T, s.A, []int32{0, int32(v), 1}, 3)
		loss := s.Empty(tensor.F32, 1)
		dl := s.Empty(tensor.F32, 3, v)
		err := s.E.CrossEntropy(loss, dl, x, targets, false)
		if !s.E.IsGraphCapable() { // the host reports it
			if !errors.Is(err, ops.ErrLabel) {
				s.T.Fatalf("V=%d: target V: %v, want ErrLabel", v, err)
			}
			continue
		}
		s.NoErr("cross-entropy", err)
		if l := s.Read(loss)[0]; !math.IsNaN(l) {
			s.T.Fatalf("V=%d: loss with a target ≥ V = %v, want NaN", v, l)
		}
	}
}

func xentValidation(s *Suite) {
	x, _ := s.Rand(tensor.F32, 1, 4, 6)
	tg := UploadI32(s.T, s.A, []int32{0, 1, 2, 3}, 4)
	loss := s.Empty(tensor.F32, 1)
	dl := s.Empty(tensor.F32, 4, 6)
	colX, err := x.Narrow(1, 0, 1)
	s.NoErr("narrow", err)
	tr, err := x.Transpose(0, 1)
	s.NoErr("transpose", err)
	cases := []struct {
		name               string
		loss, dl, x, targs *tensor.Tensor
		want               error
	}{
		{"f32 targets", loss, dl, x, s.Empty(tensor.F32, 4), tensor.ErrDType},
		{"too few targets", loss, dl, x, UploadI32(s.T, s.A, []int32{0, 1, 2}, 3), tensor.ErrShape},
		{"bf16 loss", s.Empty(tensor.BF16, 1), dl, x, tg, tensor.ErrDType},
		{"loss of two elements", s.Empty(tensor.F32, 2), dl, x, tg, tensor.ErrShape},
		{"dlogits of another shape", loss, s.Empty(tensor.F32, 4, 7), x, tg, tensor.ErrShape},
		{"i32 logits", loss, nil, s.Empty(tensor.I32, 4, 6), tg, tensor.ErrDType},
		{"transposed logits", loss, nil, tr, UploadI32(s.T, s.A, make([]int32, 6), 6), tensor.ErrLayout},
		{"missing logits", loss, nil, nil, tg, tensor.ErrShape},
		{"column logits (V = 1, strided rows)", loss, nil, colX, UploadI32(s.T, s.A, make([]int32, 4), 4), nil},
	}
	for _, tc := range cases {
		if err := s.E.CrossEntropy(tc.loss, tc.dl, tc.x, tc.targs, false); !errors.Is(err, tc.want) {
			s.T.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := s.E.CrossEntropyRows(s.Empty(tensor.F32, 3), x, tg); !errors.Is(err, tensor.ErrShape) {
		s.T.Errorf("rowloss of 3 for 4 rows: %v, want ErrShape", err)
	}
}
