package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "stablemax", Check: checkStablemax}) }

// RefStablemax is the float64 reference of ops.Engine.StablemaxCrossEntropy
// on row-major logits x [rows, V] as HRM's stablemax_cross_entropy
// computes it (log_stablemax = log(s(x)/Σ s(x)), gathered at the target;
// negative targets give 0): each row's loss, the scaled sum over groups
// of `group` rows (0: all) of each group's mean over its valid rows, and
// that loss's gradient (derived by hand from s'(x); the checks compare it
// with finite differences too).
func RefStablemax(x []float64, t []int32, V, group int, scale float64) (rows []float64, loss float64, grad []float64) {
	n := len(t)
	if group == 0 {
		group = max(n, 1)
	}
	rows, grad = make([]float64, n), make([]float64, n*V)
	for g0 := 0; g0 < n; g0 += group {
		valid := 0
		for _, ti := range t[g0 : g0+group] {
			if ti >= 0 {
				valid++
			}
		}
		w := scale / float64(max(valid, 1))
		for i := g0; i < g0+group; i++ {
			if t[i] < 0 {
				continue
			}
			row := x[i*V : (i+1)*V]
			var S float64
			for _, a := range row {
				S += ops.StablemaxS(a)
			}
			p := ops.StablemaxS(row[t[i]]) / S
			rows[i] = -math.Log(p)
			loss += w * rows[i]
			ds := func(a float64) float64 {
				if a >= 0 {
					return 1
				}
				return 1 / ((1 - a) * (1 - a))
			}
			for j, a := range row {
				grad[i*V+j] = w * ds(a) / S
			}
			grad[i*V+int(t[i])] -= w * ds(row[t[i]]) / ops.StablemaxS(row[t[i]])
		}
	}
	return rows, loss, grad
}

// RefStablemaxTerms is the terms' size (TermsErr) of RefStablemax's
// results: a row's loss log S − log s(x_t) takes two logarithms of
// positive sums, each known to the precision of 1 (a row's terms are 1;
// the loss's, the rows' weights summed); the gradient w·(s'(x_j)/S −
// [j = t]·s'(x_t)/s(x_t)) sums both parts' sizes.
func RefStablemaxTerms(x []float64, t []int32, V, group int, scale float64) (rows []float64, loss float64, grad []float64) {
	n := len(t)
	if group == 0 {
		group = max(n, 1)
	}
	_, _, g := RefStablemax(x, t, V, group, scale)
	rows, grad = make([]float64, n), Abs(g)
	for g0 := 0; g0 < n; g0 += group {
		valid := 0
		for _, ti := range t[g0 : g0+group] {
			if ti >= 0 {
				valid++
			}
		}
		w := math.Abs(scale) / float64(max(valid, 1))
		for i := g0; i < g0+group; i++ {
			if t[i] < 0 {
				continue
			}
			rows[i] = 1
			loss += w
			a := x[i*V+int(t[i])]
			ds := 1.0
			if a < 0 {
				ds = 1 / ((1 - a) * (1 - a))
			}
			grad[i*V+int(t[i])] += 2 * w * ds / ops.StablemaxS(a)
		}
	}
	return rows, loss, grad
}

func checkStablemax(s *Suite) {
	for _, xdt := range s.DTypes() {
		for _, gdt := range s.DTypes() {
			for _, c := range []struct{ b, t, v, group int }{
				{1, 1, 1, 0}, {1, 7, 11, 0}, {2, 81, 11, 81}, {3, 5, 40, 1}, {2, 6, 1000, 3},
			} {
				s.Run(fmt.Sprintf("logits=%v,dlogits=%v/%dx%dx%d/group=%d", xdt, gdt, c.b, c.t, c.v, c.group), func(s *Suite) {
					smxCase(s, xdt, gdt, c.b, c.t, c.v, c.group, 0.25, 2, 1, false)
					smxCase(s, xdt, gdt, c.b, c.t, c.v, c.group, 0.25, 2, 0.5, true)
				})
			}
		}
		s.Run(fmt.Sprintf("%v/scale=30", xdt), func(s *Suite) { smxCase(s, xdt, xdt, 3, 9, 11, 9, 0.2, 30, 1, false) })
		s.Run(fmt.Sprintf("%v/all-ignored", xdt), func(s *Suite) {
			smxCase(s, xdt, xdt, 2, 5, 11, 5, 1, 1, 1, false)
			smxCase(s, xdt, xdt, 2, 5, 11, 0, 1, 1, 1, true)
		})
		s.Run(fmt.Sprintf("%v/slice", xdt), func(s *Suite) { smxSlice(s, xdt) })
		s.Run(fmt.Sprintf("%v/in-place", xdt), func(s *Suite) { smxInPlace(s, xdt) })
		s.Run(fmt.Sprintf("%v/grad", xdt), func(s *Suite) { smxGrad(s, xdt) })
	}
	s.Run("bad-target", smxBadTarget)
	s.Run("validation", smxValidation)
}

// smxCase runs StablemaxCrossEntropy on B·T rows of V logits from
// N(0, scale²) with a fraction pIgnore of the targets ignored (HRM's
// −100 among them): loss, row losses and gradient poisoned first (or the
// gradient random and accumulated into, with acc), then the loss alone
// and the row losses alone.
func smxCase(s *Suite, xdt, gdt tensor.DType, B, T, V, group int, pIgnore, scale float64, lscale float32, acc bool) {
	x, xv := s.Rand(xdt, scale, B, T, V)
	tg := s.Targets(B*T, V, pIgnore)
	for i := range tg {
		if tg[i] == -2 {
			tg[i] = -100
		}
	}
	targets := UploadI32(s.T, s.A, tg, B, T)
	loss, rl := s.Empty(tensor.F32, 1), s.Empty(tensor.F32, B, T)
	var dl *tensor.Tensor
	var old []float64
	if acc {
		dl, old = s.Rand(gdt, 1, B, T, V)
	} else {
		dl = s.Empty(gdt, B, T, V)
	}
	s.NoErr("stablemax", s.E.StablemaxCrossEntropy(loss, rl, dl, x, targets, group, lscale, acc))
	rows, want, grad := RefStablemax(xv, tg, V, group, float64(lscale))
	trows, tl, tg2 := RefStablemaxTerms(xv, tg, V, group, float64(lscale))
	s.Close("loss", s.Read(loss), []float64{want}, []float64{tl}, 1e-6)
	s.Close("row losses", s.Read(rl), rows, trows, 1e-6)
	if acc {
		grad, tg2 = lnSum(grad, old), Sum(tg2, old)
	}
	s.Close("dlogits", s.Read(dl), grad, tg2, s.Tol(gdt))
	l2 := s.Empty(tensor.F32, 1)
	s.NoErr("stablemax (loss only)", s.E.StablemaxCrossEntropy(l2, nil, nil, x, targets, group, lscale, false))
	s.Close("loss (no gradient)", s.Read(l2), []float64{want}, []float64{tl}, 1e-6)
	rl2 := s.Empty(tensor.F32, B*T)
	s.NoErr("stablemax (rows only)", s.E.StablemaxCrossEntropy(nil, rl2, nil, x, targets, group, lscale, false))
	s.Close("row losses (alone)", s.Read(rl2), rows, trows, 1e-6)
}

// smxSlice: HRM's logits [B, 81, V] are the last 81 positions of the
// model's [B, 82, V] output (the puzzle token dropped): a view whose rows
// do not merge; the gradient goes into the same view of a wider buffer,
// whose first position stays untouched.
func smxSlice(s *Suite, xdt tensor.DType) {
	const B, T, V = 3, 81, 11
	full, fv := s.Rand(xdt, 2, B, T+1, V)
	x, err := full.Narrow(1, 1, T)
	s.NoErr("narrow", err)
	xv := make([]float64, 0, B*T*V)
	for b := 0; b < B; b++ {
		xv = append(xv, fv[(b*(T+1)+1)*V:(b+1)*(T+1)*V]...)
	}
	tg := s.Targets(B*T, V, 0)
	targets := UploadI32(s.T, s.A, tg, B, T)
	dfull := s.Empty(xdt, B, T+1, V)
	dl, err := dfull.Narrow(1, 1, T)
	s.NoErr("narrow", err)
	loss := s.Empty(tensor.F32, 1)
	s.NoErr("stablemax (slice)", s.E.StablemaxCrossEntropy(loss, nil, dl, x, targets, T, 1, false))
	_, want, grad := RefStablemax(xv, tg, V, T, 1)
	_, tl, tg2 := RefStablemaxTerms(xv, tg, V, T, 1)
	s.Close("loss (slice)", s.Read(loss), []float64{want}, []float64{tl}, 1e-6)
	s.Close("dlogits (slice)", s.Read(dl), grad, tg2, s.Tol(xdt))
	all := s.Read(dfull)
	for b := 0; b < B; b++ {
		for j := 0; j < V; j++ {
			if !math.IsNaN(all[b*(T+1)*V+j]) {
				s.T.Fatalf("dlogits of the puzzle position [%d, 0, %d] was written", b, j)
			}
		}
	}
}

// smxInPlace: the gradient overwrites the logits.
func smxInPlace(s *Suite, dt tensor.DType) {
	const B, T, V = 2, 9, 11
	x, xv := s.Rand(dt, 2, B, T, V)
	tg := s.Targets(B*T, V, 0.2)
	targets := UploadI32(s.T, s.A, tg, B*T)
	loss := s.Empty(tensor.F32, 1)
	s.NoErr("stablemax (in place)", s.E.StablemaxCrossEntropy(loss, nil, x, x, targets, T, 1, false))
	_, want, grad := RefStablemax(xv, tg, V, T, 1)
	_, tl, tg2 := RefStablemaxTerms(xv, tg, V, T, 1)
	s.Close("loss (in place)", s.Read(loss), []float64{want}, []float64{tl}, 1e-6)
	s.Close("dlogits (in place)", s.Read(x), grad, tg2, s.Tol(dt))
}

// smxGrad checks Graph.StablemaxCrossEntropy against finite differences:
// per-sequence groups, a scale, and two loss nodes on the same logits
// (the second accumulates). The step is small (1e-5): s is only C¹ at 0,
// and a step across it would measure the jump of the second derivative.
func smxGrad(s *Suite, dt tensor.DType) {
	tolB := 1e-3
	if dt == tensor.BF16 {
		tolB = 5e-2
	}
	const B, T, V = 2, 4, 11
	tg := s.Targets(B*T, V, 0.25)
	tg[0] = 3
	tg2 := s.Targets(B*T, V, 0.25)
	targets, targets2 := UploadI32(s.T, s.A, tg, B, T), UploadI32(s.T, s.A, tg2, B, T)
	s.LossGradCheck(LossCase{
		Name: "stablemax", DType: dt, Params: [][]int{{B, T, V}}, Scale: 2, H: 1e-5,
		Consts: []*tensor.Tensor{targets}, TolF: 1e-5, TolB: tolB,
		Record: func(g *ops.Graph, p, c []*ops.Var) []*ops.Var {
			return []*ops.Var{g.StablemaxCrossEntropy(p[0], c[0], T, 0.7)}
		},
		Ref: func(p [][]float64) float64 { _, l, _ := RefStablemax(p[0], tg, V, T, 0.7); return l },
	})
	s.LossGradCheck(LossCase{
		Name: "stablemax twice", DType: dt, Params: [][]int{{B, T, V}}, Scale: 2, H: 1e-5,
		Consts: []*tensor.Tensor{targets, targets2}, TolF: 1e-5, TolB: tolB,
		Record: func(g *ops.Graph, p, c []*ops.Var) []*ops.Var {
			return []*ops.Var{g.StablemaxCrossEntropy(p[0], c[0], T, 1), g.StablemaxCrossEntropy(p[0], c[1], 0, 1)}
		},
		Ref: func(p [][]float64) float64 {
			_, a, _ := RefStablemax(p[0], tg, V, T, 1)
			_, b, _ := RefStablemax(p[0], tg2, V, 0, 1)
			return a + b
		},
	})
}

func smxBadTarget(s *Suite) {
	x, _ := s.Rand(tensor.F32, 1, 3, 11)
	targets := UploadI32(s.T, s.A, []int32{0, 11, 1}, 3)
	loss := s.Empty(tensor.F32, 1)
	err := s.E.StablemaxCrossEntropy(loss, nil, s.Empty(tensor.F32, 3, 11), x, targets, 0, 1, false)
	if !s.E.IsGraphCapable() {
		if !errors.Is(err, ops.ErrLabel) {
			s.T.Fatalf("target V: %v, want ErrLabel", err)
		}
		return
	}
	s.NoErr("stablemax", err)
	if l := s.Read(loss)[0]; !math.IsNaN(l) {
		s.T.Fatalf("loss with a target ≥ V = %v, want NaN", l)
	}
}

func smxValidation(s *Suite) {
	x, _ := s.Rand(tensor.F32, 1, 4, 6)
	tg := UploadI32(s.T, s.A, []int32{0, 1, 2, 3}, 4)
	loss := s.Empty(tensor.F32, 1)
	perm, err := s.Empty(tensor.F32, 3, 2, 4, 6).Permute(1, 0, 2, 3)
	s.NoErr("permute", err)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"f32 targets", s.E.StablemaxCrossEntropy(loss, nil, nil, x, s.Empty(tensor.F32, 4), 0, 1, false), tensor.ErrDType},
		{"too few targets", s.E.StablemaxCrossEntropy(loss, nil, nil, x, UploadI32(s.T, s.A, []int32{0, 1, 2}, 3), 0, 1, false), tensor.ErrShape},
		{"bf16 loss", s.E.StablemaxCrossEntropy(s.Empty(tensor.BF16, 1), nil, nil, x, tg, 0, 1, false), tensor.ErrDType},
		{"loss of two", s.E.StablemaxCrossEntropy(s.Empty(tensor.F32, 2), nil, nil, x, tg, 0, 1, false), tensor.ErrShape},
		{"rowloss of three", s.E.StablemaxCrossEntropy(loss, s.Empty(tensor.F32, 3), nil, x, tg, 0, 1, false), tensor.ErrShape},
		{"dlogits of another shape", s.E.StablemaxCrossEntropy(loss, nil, s.Empty(tensor.F32, 4, 7), x, tg, 0, 1, false), tensor.ErrShape},
		{"i32 logits", s.E.StablemaxCrossEntropy(loss, nil, nil, s.Empty(tensor.I32, 4, 6), tg, 0, 1, false), tensor.ErrDType},
		{"group not dividing", s.E.StablemaxCrossEntropy(loss, nil, nil, x, tg, 3, 1, false), ops.ErrConfig},
		{"negative group", s.E.StablemaxCrossEntropy(loss, nil, nil, x, tg, -2, 1, false), ops.ErrConfig},
		{"NaN scale", s.E.StablemaxCrossEntropy(loss, nil, nil, x, tg, 0, float32(math.NaN()), false), ops.ErrConfig},
		{"unmergeable leading dims", s.E.StablemaxCrossEntropy(loss, nil, nil, perm, UploadI32(s.T, s.A, make([]int32, 24), 24), 0, 1, false), tensor.ErrLayout},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			s.T.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if !math.IsNaN(s.Read(loss)[0]) {
		s.T.Error("a rejected call wrote the loss")
	}
}
