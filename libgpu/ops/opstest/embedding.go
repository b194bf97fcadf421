package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "embedding", Check: checkEmbedding}) }

// RefEmbedding is the float64 reference of ops.Embedding: y[r, :] =
// table[idx[r], :] for table [v, c] row-major.
func RefEmbedding(table []float64, idx []int32, c int) []float64 {
	y := make([]float64, 0, len(idx)*c)
	for _, k := range idx {
		y = append(y, table[int(k)*c:(int(k)+1)*c]...)
	}
	return y
}

// RefEmbeddingBackward is the float64 reference of
// ops.EmbeddingBackward: dtable [v, c] = Σ of dy's rows by index, plus old
// (nil: zeros).
func RefEmbeddingBackward(dy []float64, idx []int32, v, c int, old []float64) []float64 {
	d := make([]float64, v*c)
	copy(d, old)
	for r, k := range idx {
		for j := 0; j < c; j++ {
			d[int(k)*c+j] += dy[r*c+j]
		}
	}
	return d
}

// Indices draws n indices in [0, v): uniform, or with dup heavy ones,
// three quarters of them from the first two values (the collisions of a
// character vocabulary, where the backward's sums are long).
func (s *Suite) Indices(n, v int, heavy bool) []int32 {
	idx := make([]int32, n)
	for i := range idx {
		k := s.R.IntN(v)
		if heavy && s.R.IntN(4) != 0 {
			k = s.R.IntN(min(v, 2))
		}
		idx[i] = int32(k)
	}
	return idx
}

func checkEmbedding(s *Suite) {
	for _, tdt := range s.DTypes() {
		for _, ydt := range s.DTypes() {
			for _, sh := range [][3]int{{1, 1, 1}, {7, 5, 13}, {65, 12, 37}, {300, 33, 70}} {
				v, c, n := sh[0], sh[1], sh[2]
				s.Run(fmt.Sprintf("forward/table=%v,y=%v/V=%d,C=%d,N=%d", tdt, ydt, v, c, n), func(s *Suite) {
					embeddingForward(s, tdt, ydt, v, c, []int{n})
				})
				s.Run(fmt.Sprintf("backward/dy=%v,dtable=%v/V=%d,C=%d,N=%d", ydt, tdt, v, c, n), func(s *Suite) {
					embeddingBackward(s, ydt, tdt, v, c, n, false, false)
					embeddingBackward(s, ydt, tdt, v, c, n, true, true)
				})
			}
		}
		s.Run(fmt.Sprintf("%v/forward-rank3", tdt), func(s *Suite) { embeddingForward(s, tdt, tdt, 11, 8, []int{2, 3, 5}) })
		s.Run(fmt.Sprintf("%v/strided-y", tdt), func(s *Suite) { embeddingStrided(s, tdt) })
		s.Run(fmt.Sprintf("%v/grad", tdt), func(s *Suite) { embeddingGrad(s, tdt) })
	}
	// Many indices: several radix-sort tiles (1024 keys), runs crossing
	// many backward chunks (32 sorted positions), and two sort passes
	// (V > 255).
	for _, sh := range [][3]int{{65, 24, 3000}, {300, 8, 2500}, {5, 3, 2049}} {
		s.Run(fmt.Sprintf("backward-many/V=%d,C=%d,N=%d", sh[0], sh[1], sh[2]), func(s *Suite) {
			embeddingBackward(s, tensor.F32, tensor.F32, sh[0], sh[1], sh[2], true, false)
			embeddingBackward(s, tensor.BF16, tensor.F32, sh[0], sh[1], sh[2], false, true)
		})
	}
	s.Run("tied-weights", embeddingTied)
	s.Run("out-of-range", embeddingOutOfRange)
	s.Run("empty", embeddingEmpty)
	s.Run("validation", embeddingValidation)
}

func embeddingForward(s *Suite, tdt, ydt tensor.DType, v, c int, idxShape []int) {
	table, tv := s.Rand(tdt, 1, v, c)
	n := tensor.Numel(idxShape)
	ix := s.Indices(n, v, false)
	idx := UploadI32(s.T, s.A, ix, idxShape...)
	y := s.Empty(ydt, append(append([]int(nil), idxShape...), c)...)
	s.NoErr("embedding", s.E.Embedding(y, table, idx))
	s.Close("y", s.Read(y), embRound(ydt, RefEmbedding(tv, ix, c)), nil, 0)
}

// embRound rounds float64 values to what dtype dt stores.
func embRound(dt tensor.DType, v []float64) []float64 {
	f := F32(v)
	if dt == tensor.BF16 {
		f = tensor.RoundBF16(f)
	}
	return F64(f)
}

func embeddingBackward(s *Suite, dydt, tdt tensor.DType, v, c, n int, heavy, acc bool) {
	ix := s.Indices(n, v, heavy)
	idx := UploadI32(s.T, s.A, ix, n)
	dy, dyv := s.Rand(dydt, 1, n, c)
	var dt *tensor.Tensor
	var old []float64
	if acc {
		dt, old = s.Rand(tdt, 1, v, c)
	} else {
		dt = s.Empty(tdt, v, c) // poisoned: rows no index names must become 0
	}
	s.NoErr("embedding backward", s.E.EmbeddingBackward(dt, dy, idx, acc))
	want := RefEmbeddingBackward(dyv, ix, v, c, old)
	// f32 sums of up to n terms of N(0,1): error ~ n·2⁻²⁴ of the row's
	// magnitude (√count); bf16 results round to 2⁻⁸.
	tol := s.Tol(tdt)
	if tdt == tensor.F32 {
		tol = max(tol, float64(n)*6e-8)
	}
	got := s.Read(dt)
	s.Close(fmt.Sprintf("dtable (heavy=%v, acc=%v)", heavy, acc), got, want, RefEmbeddingBackward(Abs(dyv), ix, v, c, Abs(old)), tol)
	if !acc {
		used := map[int32]bool{}
		for _, k := range ix {
			used[k] = true
		}
		for k := 0; k < v; k++ {
			if used[int32(k)] {
				continue
			}
			for j := 0; j < c; j++ {
				if got[k*c+j] != 0 {
					s.T.Fatalf("dtable row %d (no index) [%d] = %v, want 0", k, j, got[k*c+j])
				}
			}
		}
	}
}

func embeddingStrided(s *Suite, dt tensor.DType) {
	// y and dy are column blocks of wider tensors (row stride C+5).
	const v, c, n = 9, 12, 17
	table, tv := s.Rand(dt, 1, v, c)
	ix := s.Indices(n, v, true)
	idx := UploadI32(s.T, s.A, ix, n)
	wide := s.Empty(dt, n, c+5)
	y, err := wide.Narrow(1, 3, c)
	s.NoErr("narrow", err)
	s.NoErr("embedding", s.E.Embedding(y, table, idx))
	s.Close("y (strided)", s.Read(y), RefEmbedding(tv, ix, c), nil, 0)
	all := s.Read(wide)
	for r := 0; r < n; r++ {
		for j := 0; j < c+5; j++ {
			if (j < 3 || j >= 3+c) && !math.IsNaN(all[r*(c+5)+j]) {
				s.T.Fatalf("element [%d,%d] outside the view was written", r, j)
			}
		}
	}
	dwide, dwv := s.Rand(dt, 1, n, c+5)
	dy, err := dwide.Narrow(1, 3, c)
	s.NoErr("narrow", err)
	dyv := make([]float64, 0, n*c)
	for r := 0; r < n; r++ {
		dyv = append(dyv, dwv[r*(c+5)+3:r*(c+5)+3+c]...)
	}
	dtab := s.Empty(dt, v, c)
	s.NoErr("embedding backward", s.E.EmbeddingBackward(dtab, dy, idx, false))
	s.Close("dtable (strided dy)", s.Read(dtab), RefEmbeddingBackward(dyv, ix, v, c, nil), nil, s.Tol(dt))
}

func embeddingGrad(s *Suite, dt tensor.DType) {
	for _, tc := range []struct {
		v, c, n int
		heavy   bool
	}{{7, 5, 11, false}, {4, 6, 40, true}} {
		ix := s.Indices(tc.n, tc.v, tc.heavy)
		shape := []int{tc.n}
		if tc.n%2 == 0 {
			shape = []int{2, tc.n / 2} // y is [2, n/2, C]
		}
		idx := UploadI32(s.T, s.A, ix, shape...)
		s.GradCheck(GradCase{
			Name: fmt.Sprintf("embedding V=%d C=%d N=%d heavy=%v", tc.v, tc.c, tc.n, tc.heavy), DType: dt,
			Params: [][]int{{tc.v, tc.c}}, Consts: []*tensor.Tensor{idx}, Twice: true,
			Record: func(g *ops.Graph, p, c []*ops.Var) *ops.Var { return g.Embedding(p[0], c[0]) },
			Ref:    func(p [][]float64) []float64 { return RefEmbedding(p[0], ix, tc.c) },
		})
	}
}

// embeddingTied checks weight tying as a GPT's has it: the token table is
// read by the embedding and, through a bf16 cast under autocast, by the
// language-model head (y·tableᵀ); its f32 gradient is the sum of the GEMM's
// and the scatter-add's, whichever runs first.
func embeddingTied(s *Suite) {
	const v, c, n = 6, 5, 9
	for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
		g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Autocast: act})
		tab, tv := s.Rand(tensor.F32, 1, v, c)
		ix := s.Indices(n, v, true)
		table := g.Param("wte", tab, s.Empty(tensor.F32, v, c))
		idx := g.Input("idx", UploadI32(s.T, s.A, ix, n))
		h := g.Embedding(table, idx)
		logits := g.Linear(h, table, nil, ops.ActNone) // [n, v]
		var w []float64
		DotLoss(s, g, logits, func(x []float64) { w = x })
		s.NoErr("build", g.Build(true))
		s.NoErr("forward", g.Forward())
		s.NoErr("backward", g.Backward())
		got := s.Read(table.Grad)
		// L = Σ w·(T[idx]·Tᵀ): dT = scatter(w·T) + wᵀ·T[idx].
		ref := func(t []float64) []float64 {
			hh := RefEmbedding(t, ix, c)
			return RefMatmul(hh, t, n, v, c, false, true)
		}
		g.Free()
		fd, terms := FDGradTerms(ref, append([]float64(nil), tv...), w, 1e-3)
		tol := 10 * s.GemmTol(tensor.F32) // the head's GEMMs run in TF32 under PrecTF32
		if act == tensor.BF16 {
			tol = 3e-2
		}
		s.Close(fmt.Sprintf("tied gradient (autocast %v)", act), got, fd, terms, tol)
	}
}

func embeddingOutOfRange(s *Suite) {
	const v, c = 5, 4
	table, tv := s.Rand(tensor.F32, 1, v, c)
	ix := []int32{1, v, 2, -1}
	idx := UploadI32(s.T, s.A, ix, len(ix))
	y := s.Empty(tensor.F32, len(ix), c)
	err := s.E.Embedding(y, table, idx)
	dy, dyv := s.Rand(tensor.F32, 1, len(ix), c)
	dt := s.Empty(tensor.F32, v, c)
	errB := s.E.EmbeddingBackward(dt, dy, idx, false)
	if !s.E.IsGraphCapable() { // the host reports it
		if !errors.Is(err, ops.ErrLabel) || !errors.Is(errB, ops.ErrLabel) {
			s.T.Fatalf("out-of-range index: forward %v, backward %v, want ErrLabel", err, errB)
		}
		return
	}
	// CUDA: zero rows in the forward; the backward skips them.
	s.NoErr("embedding", err)
	s.NoErr("embedding backward", errB)
	want := make([]float64, 0, len(ix)*c)
	for _, k := range ix {
		if k < 0 || k >= v {
			want = append(want, make([]float64, c)...)
		} else {
			want = append(want, tv[int(k)*c:(int(k)+1)*c]...)
		}
	}
	s.Close("y with out-of-range indices", s.Read(y), want, nil, 0)
	var okIx []int32
	var okDy []float64
	for r, k := range ix {
		if k >= 0 && k < v {
			okIx, okDy = append(okIx, k), append(okDy, dyv[r*c:(r+1)*c]...)
		}
	}
	s.Close("dtable with out-of-range indices", s.Read(dt), RefEmbeddingBackward(okDy, okIx, v, c, nil), nil, 0)
}

// embeddingEmpty: no indices (the backward zeroes dtable) and no columns.
func embeddingEmpty(s *Suite) {
	table, _ := s.Rand(tensor.F32, 1, 3, 4)
	idx := s.Empty(tensor.I32, 0)
	s.NoErr("embedding of no indices", s.E.Embedding(s.Empty(tensor.F32, 0, 4), table, idx))
	dt := s.Empty(tensor.F32, 3, 4)
	s.NoErr("backward of no indices", s.E.EmbeddingBackward(dt, s.Empty(tensor.F32, 0, 4), idx, false))
	s.Close("dtable of no indices", s.Read(dt), make([]float64, 12), nil, 0)
	idx2 := UploadI32(s.T, s.A, []int32{0, 2}, 2)
	s.NoErr("embedding of no columns", s.E.Embedding(s.Empty(tensor.F32, 2, 0), s.Empty(tensor.F32, 3, 0), idx2))
	s.NoErr("backward of no columns", s.E.EmbeddingBackward(s.Empty(tensor.F32, 3, 0), s.Empty(tensor.F32, 2, 0), idx2, false))
}

func embeddingValidation(s *Suite) {
	table, _ := s.Rand(tensor.F32, 1, 5, 4)
	idx := UploadI32(s.T, s.A, []int32{0, 1, 2}, 3)
	y := s.Empty(tensor.F32, 3, 4)
	fidx := s.Empty(tensor.F32, 3)
	flat, _ := s.Rand(tensor.F32, 1, 20)
	wideIdx := UploadI32(s.T, s.A, make([]int32, 6), 3, 2)
	colIdx, err := wideIdx.Narrow(1, 0, 1) // [3, 1], row stride 2
	s.NoErr("narrow", err)
	yCol := s.Empty(tensor.F32, 3, 1, 4)
	cases := []struct {
		name      string
		y, t, idx *tensor.Tensor
		want      error
	}{
		{"f32 indices", y, table, fidx, tensor.ErrDType},
		{"table of rank 1", y, flat, idx, tensor.ErrShape},
		{"y of the wrong width", s.Empty(tensor.F32, 3, 5), table, idx, tensor.ErrShape},
		{"y of the wrong rows", s.Empty(tensor.F32, 4, 4), table, idx, tensor.ErrShape},
		{"i32 y", s.Empty(tensor.I32, 3, 4), table, idx, tensor.ErrDType},
		{"strided indices", yCol, table, colIdx, tensor.ErrLayout},
		{"missing y", nil, table, idx, tensor.ErrShape},
	}
	for _, tc := range cases {
		if err := s.E.Embedding(tc.y, tc.t, tc.idx); !errors.Is(err, tc.want) {
			s.T.Errorf("forward, %s: %v, want %v", tc.name, err, tc.want)
		}
		if err := s.E.EmbeddingBackward(tc.t, tc.y, tc.idx, false); !errors.Is(err, tc.want) {
			s.T.Errorf("backward, %s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
