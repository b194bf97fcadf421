package opstest

import (
	"fmt"
	"math"
	"slices"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "routing", Check: checkRouting}) }

// RefTopK is the float64 reference of ops.Engine.MoETopK: each row's k
// largest logits (ties: the lower index first), best first, and their
// softmax over the k chosen.
func RefTopK(logits []float64, t, e, k int) (experts []int32, weights []float64) {
	experts, weights = make([]int32, t*k), make([]float64, t*k)
	idx := make([]int, e)
	for r := 0; r < t; r++ {
		row := logits[r*e : (r+1)*e]
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			switch {
			case row[a] > row[b]:
				return -1
			case row[a] < row[b]:
				return 1
			}
			return 0
		})
		var s float64
		for j := 0; j < k; j++ {
			s += math.Exp(row[idx[j]] - row[idx[0]])
		}
		for j := 0; j < k; j++ {
			experts[r*k+j] = int32(idx[j])
			weights[r*k+j] = math.Exp(row[idx[j]]-row[idx[0]]) / s
		}
	}
	return experts, weights
}

// RefRoute is the reference of ops.Engine.MoERoute: a stable counting sort
// of the choices by expert.
func RefRoute(experts []int32, e int) (counts, offsets, perm, rows []int32) {
	counts, offsets = make([]int32, e), make([]int32, e+1)
	perm, rows = make([]int32, len(experts)), make([]int32, len(experts))
	for _, x := range experts {
		counts[x]++
	}
	for i := 0; i < e; i++ {
		offsets[i+1] = offsets[i] + counts[i]
	}
	next := append([]int32(nil), offsets[:e]...)
	for a, x := range experts {
		perm[a], rows[next[x]] = next[x], int32(a)
		next[x]++
	}
	return
}

// RefCombine is y[t] = Σ_j w[t, j]·ys[perm[t, j]] for ys [T·k, d].
func RefCombine(ys, w []float64, perm []int32, t, k, d int) []float64 {
	y := make([]float64, t*d)
	for a, r := range perm {
		for c := 0; c < d; c++ {
			y[a/k*d+c] += w[a] * ys[int(r)*d+c]
		}
	}
	return y
}

// RefAuxLosses is the reference of ops.Engine.MoEAuxLoss's values: the
// load-balancing loss E·Σ_i (counts_i/T)·P_i and the z-loss mean_t lse_t².
func RefAuxLosses(logits []float64, counts []int32, t, e int) []float64 {
	p := make([]float64, e)
	var z float64
	for r := 0; r < t; r++ {
		row := logits[r*e : (r+1)*e]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, v)
		}
		var s float64
		for _, v := range row {
			s += math.Exp(v - m)
		}
		lse := m + math.Log(s)
		z += lse * lse
		for i, v := range row {
			p[i] += math.Exp(v-lse) / float64(t)
		}
	}
	var a float64
	for i, c := range counts {
		a += float64(c) / float64(t) * p[i]
	}
	return []float64{float64(e) * a, z / float64(t)}
}

// randLogits draws T×E router logits from N(0, 2²).
func randLogits(s *Suite, t, e int) (*tensor.Tensor, []float64) {
	return s.Rand(tensor.F32, 2, t, e)
}

func checkRouting(s *Suite) {
	for _, c := range []struct{ t, e, k int }{{1, 1, 1}, {37, 5, 2}, {700, 8, 2}, {300, 64, 8}, {64, 3, 3}} {
		s.Run(fmt.Sprintf("topk-route/T%d,E%d,k%d", c.t, c.e, c.k), func(s *Suite) { routingTopKRoute(s, c.t, c.e, c.k) })
	}
	s.Run("topk-ties", routingTies)
	s.Run("aux-loss", routingAux)
	for _, dt := range s.DTypes() {
		for _, d := range []int{7, 24} {
			s.Run(fmt.Sprintf("%v/permute-combine/d%d", dt, d), func(s *Suite) { routingPermuteCombine(s, dt, 41, 6, 2, d) })
		}
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) { routingGrad(s, dt) })
	}
	s.Run("validation", routingValidation)
}

// routingTopKRoute: MoETopK and MoERoute against the references (the
// permutation exactly), the routing invariants, and MoETopKBackward
// against its closed form.
func routingTopKRoute(s *Suite, t, e, k int) {
	logits, lv := randLogits(s, t, e)
	w, ex := s.Empty(tensor.F32, t, k), s.Empty(tensor.I32, t, k)
	s.NoErr("top-k", s.E.MoETopK(w, ex, logits))
	wantEx, wantW := RefTopK(lv, t, e, k)
	gotEx := DownloadI32(s.T, ex)
	if !slices.Equal(gotEx, wantEx) {
		s.T.Fatalf("experts %v, want %v", head(gotEx), head(wantEx))
	}
	s.Close("weights", s.Read(w), wantW, nil, s.Tol(tensor.F32))

	counts, offsets := s.Empty(tensor.I32, e), s.Empty(tensor.I32, e+1)
	perm, rows := s.Empty(tensor.I32, t, k), s.Empty(tensor.I32, t*k)
	s.NoErr("route", s.E.MoERoute(counts, offsets, perm, rows, ex))
	wc, wo, wp, wr := RefRoute(wantEx, e)
	gc, gof, gp, gr := DownloadI32(s.T, counts), DownloadI32(s.T, offsets), DownloadI32(s.T, perm), DownloadI32(s.T, rows)
	for _, c := range []struct {
		what      string
		got, want []int32
	}{{"counts", gc, wc}, {"offsets", gof, wo}, {"perm", gp, wp}, {"rows", gr, wr}} {
		if !slices.Equal(c.got, c.want) {
			s.T.Errorf("%s %v, want %v", c.what, head(c.got), head(c.want))
		}
	}
	CheckRoutingInvariants(s, gotEx, gc, gof, gp, gr, t, e, k)

	// The weights' gradient: the softmax over the chosen logits.
	dw, dwv := s.Rand(tensor.F32, 1, t, k)
	dl := s.Empty(tensor.F32, t, e)
	s.NoErr("top-k backward", s.E.MoETopKBackward(dl, dw, w, ex, false))
	want, terms := make([]float64, t*e), make([]float64, t*e)
	for r := 0; r < t; r++ {
		var sum, tsum float64
		for j := 0; j < k; j++ {
			sum += wantW[r*k+j] * dwv[r*k+j]
			tsum += math.Abs(wantW[r*k+j] * dwv[r*k+j])
		}
		for j := 0; j < k; j++ {
			i := r*e + int(wantEx[r*k+j])
			want[i] = wantW[r*k+j] * (dwv[r*k+j] - sum)
			terms[i] = wantW[r*k+j] * (math.Abs(dwv[r*k+j]) + tsum)
		}
	}
	s.Close("dlogits", s.Read(dl), want, terms, 1e-5)
}

// CheckRoutingInvariants checks what dropless top-k routing guarantees:
// every token reaches exactly k distinct experts; counts sum to k·T and
// match the choices; offsets are their prefix sums; rows and perm are
// inverse permutations of the T·k choices; and the rows of expert i are
// exactly [offsets[i], offsets[i+1]).
func CheckRoutingInvariants(s *Suite, experts, counts, offsets, perm, rows []int32, t, e, k int) {
	s.T.Helper()
	n := t * k
	var total int32
	for i, c := range counts {
		total += c
		if offsets[i+1]-offsets[i] != c {
			s.T.Errorf("expert %d: offsets %d..%d for %d choices", i, offsets[i], offsets[i+1], c)
		}
	}
	if int(total) != n || offsets[0] != 0 || int(offsets[e]) != n {
		s.T.Errorf("counts sum to %d (offsets %d..%d), want k·T = %d", total, offsets[0], offsets[e], n)
	}
	seen := make([]int, n)
	for tok := 0; tok < t; tok++ {
		mine := map[int32]bool{}
		for j := 0; j < k; j++ {
			a := tok*k + j
			x := experts[a]
			if x < 0 || int(x) >= e || mine[x] {
				s.T.Fatalf("token %d: choice %d is expert %d (twice, or outside [0, %d))", tok, j, x, e)
			}
			mine[x] = true
			r := perm[a]
			if r < 0 || int(r) >= n || rows[r] != int32(a) {
				s.T.Fatalf("choice %d: perm %d, rows[perm] not the choice", a, r)
			}
			if r < offsets[x] || r >= offsets[x+1] {
				s.T.Fatalf("choice %d of expert %d at row %d, outside [%d, %d)", a, x, r, offsets[x], offsets[x+1])
			}
			seen[r]++
		}
	}
	for r, c := range seen {
		if c != 1 {
			s.T.Fatalf("row %d holds %d choices", r, c)
		}
	}
}

func head(v []int32) []int32 { return v[:min(len(v), 16)] }

// routingTies: equal logits go to the lower expert; NaN loses to every
// number.
func routingTies(s *Suite) {
	nan := math.NaN()
	logits := s.Const(tensor.F32, []float64{1, 3, 3, 0, 3, nan, 2, nan, 2, -1}, 2, 5)
	w, ex := s.Empty(tensor.F32, 2, 3), s.Empty(tensor.I32, 2, 3)
	s.NoErr("top-k", s.E.MoETopK(w, ex, logits))
	if got, want := DownloadI32(s.T, ex), []int32{1, 2, 4, 1, 3, 4}; !slices.Equal(got, want) {
		s.T.Errorf("experts %v, want %v", got, want)
	}
	third := 1.0 / 3
	a := 1 / (2 + math.Exp(-3))
	s.Close("weights", s.Read(w), []float64{third, third, third, a, a, math.Exp(-3) * a}, nil, 1e-6)
}

// routingAux: MoEAuxLoss's values and its gradient against central
// differences of the float64 losses (counts held fixed).
func routingAux(s *Suite) {
	const t, e, k = 45, 6, 2
	logits, lv := randLogits(s, t, e)
	ex, _ := RefTopK(lv, t, e, k)
	counts, _, _, _ := RefRoute(ex, e)
	cv := UploadI32(s.T, s.A, counts, e)
	losses, dl := s.Empty(tensor.F32, 2), s.Empty(tensor.F32, t, e)
	const aux, zc = 0.7, 0.3
	s.NoErr("aux loss", s.E.MoEAuxLoss(losses, dl, logits, cv, aux, zc, false))
	want := RefAuxLosses(lv, counts, t, e)
	s.Close("losses", s.Read(losses), want, nil, 1e-5)
	fd, terms := FDGradTerms(func(x []float64) []float64 { return RefAuxLosses(x, counts, t, e) }, append([]float64(nil), lv...),
		[]float64{aux, zc}, 1e-4)
	s.Close("dlogits", s.Read(dl), fd, terms, 1e-4)
	// acc adds; without dlogits only the values.
	old, oldv := s.Rand(tensor.F32, 1, t, e)
	s.NoErr("aux loss (acc)", s.E.MoEAuxLoss(losses, old, logits, cv, aux, zc, true))
	sum := make([]float64, len(fd))
	for i := range sum {
		sum[i] = fd[i] + oldv[i]
	}
	s.Close("dlogits (acc)", s.Read(old), sum, Sum(terms, oldv), 1e-5)
	losses2 := s.Empty(tensor.F32, 2)
	s.NoErr("aux loss (values)", s.E.MoEAuxLoss(losses2, nil, logits, cv, aux, zc, false))
	s.Close("losses (values)", s.Read(losses2), want, nil, 1e-5)
	// Uniform routing and logits: the load-balancing loss is k, the z-loss ln(E)².
	flat := s.Const(tensor.F32, make([]float64, 12*4), 12, 4)
	uc := UploadI32(s.T, s.A, []int32{6, 6, 6, 6}, 4)
	s.NoErr("aux loss (uniform)", s.E.MoEAuxLoss(losses2, nil, flat, uc, 1, 1, false))
	s.Close("losses (uniform)", s.Read(losses2), []float64{2, math.Log(4) * math.Log(4)}, nil, 1e-6)
}

// routingPermuteCombine: MoEPermute, MoECombine and their backward against
// the references, outputs poisoned (with acc: added to random values).
func routingPermuteCombine(s *Suite, dt tensor.DType, t, e, k, d int) {
	_, lv := randLogits(s, t, e)
	exv, wv := RefTopK(lv, t, e, k)
	_, _, perm, rows := RefRoute(exv, e)
	pt, rt := UploadI32(s.T, s.A, perm, t, k), UploadI32(s.T, s.A, rows, t*k)
	w := s.Const(tensor.F32, wv, t, k)
	wv = s.Read(w)
	x, xv := s.Rand(dt, 1, t, d)
	xs := s.Empty(dt, t*k, d)
	s.NoErr("permute", s.E.MoEPermute(xs, x, rt))
	want := make([]float64, t*k*d)
	for r, a := range rows {
		copy(want[r*d:(r+1)*d], xv[int(a)/k*d:])
	}
	s.Close("xs", s.Read(xs), want, nil, 0) // a copy: exact

	dxs, dxsv := s.Rand(dt, 1, t*k, d)
	for _, acc := range []bool{false, true} {
		dx, old := s.Empty(dt, t, d), make([]float64, t*d)
		if acc {
			dx, old = s.Rand(dt, 1, t, d)
		}
		s.NoErr("permute backward", s.E.MoEPermuteBackward(dx, dxs, pt, acc))
		wdx := append([]float64(nil), old...)
		for a, r := range perm {
			for c := 0; c < d; c++ {
				wdx[a/k*d+c] += dxsv[int(r)*d+c]
			}
		}
		s.Close(fmt.Sprintf("dx (acc %v)", acc), s.Read(dx), wdx, nil, s.Tol(dt))
	}

	ys, ysv := s.Rand(dt, 1, t*k, d)
	y := s.Empty(dt, t, d)
	s.NoErr("combine", s.E.MoECombine(y, ys, w, pt))
	s.Close("y", s.Read(y), RefCombine(ysv, wv, perm, t, k, d), nil, s.Tol(dt))
	dy, dyv := s.Rand(dt, 1, t, d)
	for _, acc := range []bool{false, true} {
		dys, dw := s.Empty(dt, t*k, d), s.Empty(tensor.F32, t, k)
		oys, ow := make([]float64, t*k*d), make([]float64, t*k)
		if acc {
			dys, oys = s.Rand(dt, 1, t*k, d)
			dw, ow = s.Rand(tensor.F32, 1, t, k)
		}
		s.NoErr("combine backward", s.E.MoECombineBackward(dys, dw, dy, ys, w, pt, [2]bool{acc, acc}))
		wys, ww := append([]float64(nil), oys...), append([]float64(nil), ow...)
		tys, tw := Abs(oys), Abs(ow) // the terms' sizes
		for a, r := range perm {
			for c := 0; c < d; c++ {
				wys[int(r)*d+c] += wv[a] * dyv[a/k*d+c]
				tys[int(r)*d+c] += math.Abs(wv[a] * dyv[a/k*d+c])
				ww[a] += dyv[a/k*d+c] * ysv[int(r)*d+c]
				tw[a] += math.Abs(dyv[a/k*d+c] * ysv[int(r)*d+c])
			}
		}
		s.Close(fmt.Sprintf("dys (acc %v)", acc), s.Read(dys), wys, tys, s.Tol(dt))
		s.Close(fmt.Sprintf("dweights (acc %v)", acc), s.Read(dw), ww, tw, s.Tol(dt))
	}
}

// routingGrad: gradients through the Graph methods against finite
// differences of float64 references — the router weights (through
// MoETopK's softmax of the chosen logits) and the experts' outputs via
// MoECombine, and x via MoEPermute. The step is small: a reference's
// choices must not change within it.
func routingGrad(s *Suite, dt tensor.DType) {
	const t, e, k, d = 9, 5, 2, 4
	s.GradCheck(GradCase{
		Name: "combine", DType: dt, Params: [][]int{{t, e}, {t * k, d}}, PDTypes: []tensor.DType{tensor.F32, dt},
		H: 1e-6, Twice: true,
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var {
			r := g.MoERoute(p[0], k, 0, 0)
			if r == nil {
				return nil
			}
			return g.MoECombine(p[1], r)
		},
		Ref: func(p [][]float64) []float64 {
			ex, w := RefTopK(p[0], t, e, k)
			_, _, perm, _ := RefRoute(ex, e)
			return RefCombine(p[1], w, perm, t, k, d)
		},
	})
	logits, lv := randLogits(s, t, e)
	ex, _ := RefTopK(lv, t, e, k)
	_, _, _, rows := RefRoute(ex, e)
	s.GradCheck(GradCase{
		Name: "permute", DType: dt, Params: [][]int{{t, d}}, Consts: []*tensor.Tensor{logits}, Twice: true,
		Record: func(g *ops.Graph, p, c []*ops.Var) *ops.Var {
			r := g.MoERoute(c[0], k, 0, 0)
			if r == nil {
				return nil
			}
			return g.MoEPermute(p[0], r)
		},
		Ref: func(p [][]float64) []float64 {
			out := make([]float64, t*k*d)
			for r, a := range rows {
				copy(out[r*d:(r+1)*d], p[0][int(a)/k*d:])
			}
			return out
		},
	})
	// RouterLogits: f32 products whatever the autocast; x of the graph's dtype.
	s.GradCheck(GradCase{
		Name: "router", DType: dt, Params: [][]int{{t, d}, {e, d}}, PDTypes: []tensor.DType{dt, tensor.F32}, Twice: true,
		TolF: s.Tol(tensor.F32) * 10, TolB: max(10*s.Tol(tensor.F32), s.Tol(dt)), // dx is stored in dt
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.RouterLogits(p[0], p[1]) },
		Ref:    func(p [][]float64) []float64 { return RefMatmul(p[0], p[1], t, e, d, false, true) },
	})
}

func routingValidation(s *Suite) {
	logits := s.Empty(tensor.F32, 4, 3)
	w, ex := s.Empty(tensor.F32, 4, 2), s.Empty(tensor.I32, 4, 2)
	bad := []struct {
		what string
		err  error
	}{
		{"k > E", s.E.MoETopK(s.Empty(tensor.F32, 4, 4), s.Empty(tensor.I32, 4, 4), logits)},
		{"bf16 logits", s.E.MoETopK(w, ex, s.Empty(tensor.BF16, 4, 3))},
		{"weights of another k", s.E.MoETopK(s.Empty(tensor.F32, 4, 1), ex, logits)},
		{"f32 experts", s.E.MoETopK(w, s.Empty(tensor.F32, 4, 2), logits)},
		{"offsets of E entries", s.E.MoERoute(s.Empty(tensor.I32, 3), s.Empty(tensor.I32, 3), s.Empty(tensor.I32, 4, 2), s.Empty(tensor.I32, 8), ex)},
		{"rows of T entries", s.E.MoERoute(s.Empty(tensor.I32, 3), s.Empty(tensor.I32, 4), s.Empty(tensor.I32, 4, 2), s.Empty(tensor.I32, 4), ex)},
		{"xs of another width", s.E.MoEPermute(s.Empty(tensor.F32, 8, 5), s.Empty(tensor.F32, 4, 6), s.Empty(tensor.I32, 8))},
		{"xs of another dtype", s.E.MoEPermute(s.Empty(tensor.BF16, 8, 6), s.Empty(tensor.F32, 4, 6), s.Empty(tensor.I32, 8))},
		{"ys of T rows", s.E.MoECombine(s.Empty(tensor.F32, 4, 6), s.Empty(tensor.F32, 4, 6), w, ex)},
		{"counts of another E", s.E.MoEAuxLoss(s.Empty(tensor.F32, 2), nil, logits, s.Empty(tensor.I32, 4), 1, 1, false)},
	}
	for _, b := range bad {
		if b.err == nil {
			s.T.Errorf("%s: accepted", b.what)
		}
	}
	if !s.E.IsGraphCapable() { // the host checks expert ids; CUDA clamps them
		bogus := UploadI32(s.T, s.A, []int32{0, 1, 2, 3, 0, 1, 2, 1}, 4, 2)
		if s.E.MoERoute(s.Empty(tensor.I32, 3), s.Empty(tensor.I32, 4), s.Empty(tensor.I32, 4, 2), s.Empty(tensor.I32, 8), bogus) == nil {
			s.T.Error("expert 3 of 3: accepted")
		}
	}
}
