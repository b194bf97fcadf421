package opstest

import (
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "dropout", Check: checkDropout}) }

// RefPhilox4x32 is Philox4x32-10 written from Salmon et al. (SC'11) and
// Random123's philox.h, apart from ops.Philox4x32: ten rounds of
// x ← (hi(M1·x2)⊕x1⊕k0, lo(M1·x2), hi(M0·x0)⊕x3⊕k1, lo(M0·x0)) with 64-bit
// products, the key bumped by the Weyl constants before every round but
// the first.
func RefPhilox4x32(ctr [4]uint32, key [2]uint32) [4]uint32 {
	mulhilo := func(a, b uint32) (hi, lo uint32) {
		p := uint64(a) * uint64(b)
		return uint32(p >> 32), uint32(p)
	}
	x := ctr
	k := key
	for round := 0; round < 10; round++ {
		if round != 0 {
			k[0] += 0x9E3779B9
			k[1] += 0xBB67AE85
		}
		h0, l0 := mulhilo(0xD2511F53, x[0])
		h1, l1 := mulhilo(0xCD9E8D57, x[2])
		x[0], x[1], x[2], x[3] = h1^x[1]^k[0], l1, h0^x[3]^k[1], l0
	}
	return x
}

// PhiloxKAT are Random123's known-answer vectors for Philox4x32-10
// (tests/kat_vectors: counter, key, result).
var PhiloxKAT = []struct {
	Ctr  [4]uint32
	Key  [2]uint32
	Want [4]uint32
}{
	{[4]uint32{0, 0, 0, 0}, [2]uint32{0, 0}, [4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
	{[4]uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, [2]uint32{0xffffffff, 0xffffffff},
		[4]uint32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
	{[4]uint32{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, [2]uint32{0xa4093822, 0x299f31d0},
		[4]uint32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
}

// RefDropoutMask is the keep mask of ops.Engine.Dropout for n elements:
// element i is kept when the uniform (r >> 8)·2⁻²⁴ of word i mod 4 of
// Philox4x32-10 at counter (i/4 low, i/4 high, site, step) under key
// (seed low, seed high) is ≥ p.
func RefDropoutMask(n int, p float32, seed uint64, site, step uint32) []bool {
	m := make([]bool, n)
	key := [2]uint32{uint32(seed), uint32(seed >> 32)}
	for q := 0; 4*q < n; q++ {
		r := RefPhilox4x32([4]uint32{uint32(q), uint32(uint64(q) >> 32), site, step}, key)
		for k := 0; k < 4 && 4*q+k < n; k++ {
			m[4*q+k] = float32(r[k]>>8)*float32(math.Ldexp(1, -24)) >= p
		}
	}
	return m
}

// RefDropout is y = x·m/(1−p) with f32 arithmetic as both backends do it
// (so a check may demand equality): kept elements are float32(x·scale),
// scale = float32 1/(1−p).
func RefDropout(x []float64, m []bool, p float32) []float64 {
	scale := float32(1) / (1 - p)
	y := make([]float64, len(x))
	for i, v := range x {
		if m[i] {
			y[i] = float64(float32(v) * scale)
		}
	}
	return y
}

const dropSeed = 0x9e3779b97f4a7c15

func checkDropout(s *Suite) {
	s.Run("philox-kat", func(s *Suite) {
		for _, c := range PhiloxKAT {
			if got := ops.Philox4x32(c.Ctr, c.Key); got != c.Want {
				s.T.Errorf("ops.Philox4x32(%08x, %08x) = %08x, want %08x", c.Ctr, c.Key, got, c.Want)
			}
			if got := RefPhilox4x32(c.Ctr, c.Key); got != c.Want {
				s.T.Errorf("RefPhilox4x32(%08x, %08x) = %08x, want %08x", c.Ctr, c.Key, got, c.Want)
			}
		}
	})
	for _, dt := range s.DTypes() {
		for _, n := range []int{1, 6, 1003, 4096} {
			s.Run(fmt.Sprintf("%v/exact/n=%d", dt, n), func(s *Suite) { dropExact(s, dt, n, 0) })
		}
		s.Run(fmt.Sprintf("%v/exact/misaligned", dt), func(s *Suite) { dropExact(s, dt, 1003, 1) })
		s.Run(fmt.Sprintf("%v/counter", dt), func(s *Suite) { dropCounter(s, dt) })
		for _, n := range []int{12, 7} {
			s.Run(fmt.Sprintf("%v/shards/n=%d", dt, n), func(s *Suite) { dropShards(s, dt, n) })
		}
		s.Run(fmt.Sprintf("%v/grad", dt), func(s *Suite) { dropGrad(s, dt) })
	}
	s.Run("statistics", dropStats)
	s.Run("graph-identity", dropIdentity)
	s.Run("validation", dropValidation)
}

// dropCounterAt allocates the i32 step counter holding step.
func dropCounterAt(s *Suite, step int32) *tensor.Tensor {
	return UploadI32(s.T, s.A, []int32{step}, 1)
}

// dropShards: dropping each of 3 shards of n elements of x at its offset
// (DropoutAt, r·n) gives the elements of dropping x whole, forward and
// backward (accumulating): what a data-parallel rank relies on to draw a
// one-rank run's masks (n = 7: groups of 4 straddle the shards).
func dropShards(s *Suite, dt tensor.DType, n int) {
	const p, site, step, shards = 0.4, 3, 9, 3
	ctr := dropCounterAt(s, step)
	x, xv := s.Rand(dt, 1, shards*n)
	y := s.Empty(dt, shards*n)
	s.NoErr("dropout", s.E.Dropout(y, x, p, dropSeed, site, ctr))
	whole := s.Read(y)
	dropEqual(s, "whole", whole, dropRound(dt, RefDropout(xv, RefDropoutMask(shards*n, p, dropSeed, site, step), p)))
	dx, dxv := s.Rand(dt, 1, shards*n)
	s.NoErr("dropout backward", s.E.DropoutBackward(dx, x, p, dropSeed, site, ctr, true))
	wholeDx := s.Read(dx)
	ys := s.Empty(dt, shards*n)
	dxs := s.Const(dt, dxv, shards*n)
	for r := range shards {
		part := func(t *tensor.Tensor) *tensor.Tensor {
			v, err := t.Narrow(0, r*n, n)
			s.NoErr("narrow", err)
			return v
		}
		off := int64(r * n)
		s.NoErr("dropout at", s.E.DropoutAt(part(ys), part(x), p, dropSeed, site, ctr, off))
		s.NoErr("dropout backward at", s.E.DropoutBackwardAt(part(dxs), part(x), p, dropSeed, site, ctr, true, off))
	}
	dropEqual(s, "shards", s.Read(ys), whole)
	dropEqual(s, "shards backward", s.Read(dxs), wholeDx)
}

// dropExact: forward and backward (written, accumulated, in place) equal
// the reference exactly, at a step read from a counter.
func dropExact(s *Suite, dt tensor.DType, n, off int) {
	const p, site, step = 0.3, 5, 77
	view := func(t *tensor.Tensor) *tensor.Tensor {
		v, err := t.Narrow(0, off, n)
		s.NoErr("narrow", err)
		return v
	}
	xw, xwv := s.Rand(dt, 1, n+off)
	x, xv := view(xw), xwv[off:]
	ctr := dropCounterAt(s, step)
	y := view(s.Empty(dt, n+off))
	s.NoErr("dropout", s.E.Dropout(y, x, p, dropSeed, site, ctr))
	m := RefDropoutMask(n, p, dropSeed, site, step)
	want := dropRound(dt, RefDropout(xv, m, p))
	dropEqual(s, "y", s.Read(y), want)

	dyw, dywv := s.Rand(dt, 1, n+off)
	dy, dyv := view(dyw), dywv[off:]
	dx := view(s.Empty(dt, n+off))
	s.NoErr("dropout backward", s.E.DropoutBackward(dx, dy, p, dropSeed, site, ctr, false))
	wdx := dropRound(dt, RefDropout(dyv, m, p))
	dropEqual(s, "dx", s.Read(dx), wdx)
	dx0w, dx0wv := s.Rand(dt, 1, n+off)
	s.NoErr("dropout backward (acc)", s.E.DropoutBackward(view(dx0w), dy, p, dropSeed, site, ctr, true))
	s.CloseAcc("dx (acc)", s.Read(view(dx0w)), dx0wv[off:], wdx, nil, s.Tol(dt))
	s.NoErr("dropout backward in place", s.E.DropoutBackward(dy, dy, p, dropSeed, site, ctr, false))
	dropEqual(s, "dx = dy in place", s.Read(dy), wdx)
}

// dropRound rounds float64 values to dt's precision (the stored values).
func dropRound(dt tensor.DType, v []float64) []float64 {
	f := F32(v)
	if dt == tensor.BF16 {
		f = tensor.RoundBF16(f)
	}
	return F64(f)
}

func dropEqual(s *Suite, what string, got, want []float64) {
	s.T.Helper()
	for i := range want {
		if got[i] != want[i] {
			s.T.Fatalf("%s[%d] = %v, want %v (exactly)", what, i, got[i], want[i])
		}
	}
}

// dropCounter: the same counter value gives the same mask; the next value,
// another call-site or another seed a different one; a nil counter is
// step 0.
func dropCounter(s *Suite, dt tensor.DType) {
	const n, p = 4096, 0.5
	x := s.Const(dt, dropOnes(n), n)
	run := func(seed uint64, site int, ctr *tensor.Tensor) []float64 {
		y := s.Empty(dt, n)
		s.NoErr("dropout", s.E.Dropout(y, x, p, seed, site, ctr))
		return s.Read(y)
	}
	ctr := dropCounterAt(s, 41)
	a, b := run(dropSeed, 0, ctr), run(dropSeed, 0, ctr)
	dropEqual(s, "same counter", b, a)
	dropEqual(s, "vs reference", a, dropRound(dt, RefDropout(dropOnes(n), RefDropoutMask(n, p, dropSeed, 0, 41), p)))
	s.NoErr("advance", ctr.Write(tensor.AsBytes([]int32{42})))
	c := run(dropSeed, 0, ctr)
	dropEqual(s, "next counter vs reference", c, dropRound(dt, RefDropout(dropOnes(n), RefDropoutMask(n, p, dropSeed, 0, 42), p)))
	for what, other := range map[string][]float64{
		"next counter": c, "another site": run(dropSeed, 1, dropCounterAt(s, 41)),
		"another seed": run(dropSeed+1, 0, dropCounterAt(s, 41)),
	} {
		// Independent masks at p = ½ agree on half the elements; the same
		// mask on all. 2048 ± 5·32 is far from 4096.
		same := 0
		for i := range a {
			if (a[i] == 0) == (other[i] == 0) {
				same++
			}
		}
		if same > n/2+5*32 || same < n/2-5*32 {
			s.T.Errorf("%s: masks agree on %d of %d elements, want about %d", what, same, n, n/2)
		}
	}
	dropEqual(s, "nil counter = step 0", run(dropSeed, 3, nil), dropRound(dt, RefDropout(dropOnes(n), RefDropoutMask(n, p, dropSeed, 3, 0), p)))
}

func dropOnes(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// dropStats: over n = 2¹⁸ elements the kept count K is Binomial(n, 1−p)
// when the draws are independent uniforms: |K − n(1−p)| ≤ 6σ, σ² =
// np(1−p) (a false failure has probability ~2e-9). The counts of 256
// chunks of 1024 elements must spread as binomials do: their sample
// variance over the binomial variance p(1−p)·1024 lies within 1 ± 6·√(2/255)
// (chi-square with 255 degrees of freedom, normal approximation). The
// seed is logged.
func dropStats(s *Suite) {
	const n, chunk = 1 << 18, 1024
	seed := s.R.Uint64()
	s.T.Logf("dropout statistics seed %#x", seed)
	x := s.Const(tensor.F32, dropOnes(n), n)
	y := s.Empty(tensor.F32, n)
	for _, p := range []float32{0.1, 0.5, 0.9} {
		s.NoErr("dropout", s.E.Dropout(y, x, p, seed, 2, nil))
		got := s.Read(y)
		kept := 0
		counts := make([]float64, n/chunk)
		for i, v := range got {
			if v != 0 {
				kept++
				counts[i/chunk]++
				if v != float64(float32(1)/(1-p)) {
					s.T.Fatalf("p=%v: kept element %v, want 1/(1−p)", p, v)
				}
			}
		}
		q := 1 - float64(p)
		sigma := math.Sqrt(n * float64(p) * q)
		if d := math.Abs(float64(kept) - n*q); d > 6*sigma {
			s.T.Errorf("p=%v: kept %d of %d, want %.0f ± %.0f (6σ)", p, kept, n, n*q, 6*sigma)
		}
		var mean, ss float64
		for _, c := range counts {
			mean += c
		}
		mean /= float64(len(counts))
		for _, c := range counts {
			ss += (c - mean) * (c - mean)
		}
		ratio := ss / float64(len(counts)-1) / (chunk * float64(p) * q)
		if bound := 6 * math.Sqrt(2/float64(len(counts)-1)); math.Abs(ratio-1) > bound {
			s.T.Errorf("p=%v: chunk count variance %.3g of the binomial's, want 1 ± %.3g", p, ratio, bound)
		}
	}
}

func dropGrad(s *Suite, dt tensor.DType) {
	const p, step = 0.4, 9
	const n = 2 * 3 * 7
	ctr := dropCounterAt(s, step)
	opts := ops.GraphOptions{Train: true, Seed: dropSeed, Counter: ctr}
	// The graph numbers dropout sites from 0 in record order.
	m0 := RefDropoutMask(n, p, dropSeed, 0, step)
	s.GradCheck(GradCase{
		Name: "dropout", DType: dt, Params: [][]int{{2, 3, 7}}, Options: opts,
		Record: func(g *ops.Graph, pv, _ []*ops.Var) *ops.Var { return g.Dropout(pv[0], p) },
		Ref:    func(pv [][]float64) []float64 { return RefDropout(pv[0], m0, p) },
	})
	// Fan-out: x feeds the dropout and the residual add, so the dropout's
	// backward accumulates onto the add's.
	s.GradCheck(GradCase{
		Name: "x + dropout(x)", DType: dt, Params: [][]int{{2, 3, 7}}, Options: opts,
		Record: func(g *ops.Graph, pv, _ []*ops.Var) *ops.Var { return g.Add(g.Dropout(pv[0], p), pv[0]) },
		Ref:    func(pv [][]float64) []float64 { return lnSum(RefDropout(pv[0], m0, p), pv[0]) },
	})
}

// dropIdentity: without Train, or with p = 0, Graph.Dropout returns its
// input and records nothing; in training each call takes the next site.
func dropIdentity(s *Suite) {
	x := s.Empty(tensor.F32, 8)
	for _, c := range []struct {
		train bool
		p     float32
	}{{false, 0.5}, {true, 0}} {
		g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Train: c.train, Seed: 1})
		xv := g.Input("x", x)
		if y := g.Dropout(xv, c.p); y != xv || g.Tape().Len() != 0 {
			s.T.Errorf("train=%v p=%v: dropout recorded an op", c.train, c.p)
		}
		s.NoErr("free", g.Free())
	}
}

func dropValidation(s *Suite) {
	x := s.Empty(tensor.F32, 8)
	for _, c := range []struct {
		what string
		err  error
	}{
		{"p < 0", s.E.Dropout(x, x, -0.1, 1, 0, nil)},
		{"p > 1", s.E.Dropout(x, x, 1.5, 1, 0, nil)},
		{"NaN p", s.E.Dropout(x, x, float32(math.NaN()), 1, 0, nil)},
		{"negative site", s.E.Dropout(x, x, 0.5, 1, -1, nil)},
		{"f32 counter", s.E.Dropout(x, x, 0.5, 1, 0, s.Empty(tensor.F32, 1))},
		{"counter of two", s.E.Dropout(x, x, 0.5, 1, 0, UploadI32(s.T, s.A, []int32{1, 2}, 2))},
		{"y of another dtype", s.E.Dropout(s.Empty(tensor.BF16, 8), x, 0.5, 1, 0, nil)},
		{"backward dx of another shape", s.E.DropoutBackward(s.Empty(tensor.F32, 9), x, 0.5, 1, 0, nil, false)},
	} {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
	// p = 1 drops everything.
	one := s.Const(tensor.F32, dropOnes(8), 8)
	y := s.Empty(tensor.F32, 8)
	s.NoErr("dropout p=1", s.E.Dropout(y, one, 1, 1, 0, nil))
	dropEqual(s, "p = 1", s.Read(y), make([]float64, 8))
}
