package optim_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// refSOAP is SOAP's published update (Vyas et al. 2024, Algorithm 1, with
// optim.SOAPConfig's order: statistics, then the basis, then the step) in
// float64 on the real part of every block, with AdamW (PyTorch's formula)
// for vectors. The first refresh (every one with EighRefresh) decomposes
// the statistics; the later ones take one step of power iteration and QR
// from the basis in use (refQRStep: the paper's §"Efficiency", the
// reference code's get_orthogonal_matrix_QR, rows in ascending order of
// the estimated eigenvalues) and permute V to follow. basis, when set,
// supplies the eigenbasis of a block at a decomposing refresh instead of
// the reference's own eigendecomposition (for blocks whose statistics are
// rank-deficient, where the eigenbasis is not unique); it gets the
// reference's statistics to check against. qrBasis, when set, likewise
// supplies a power-iteration refresh's bases and permutations (given the
// bases in use to check against). stats, when set, sees every refresh's
// statistics.
type refSOAP struct {
	cfg     optim.SOAPConfig
	shapes  [][]int
	names   []string
	t       int
	m       [][]float64 // first moments [M,N] (matrices), AdamW's (vectors)
	av      [][]float64 // AdamW's second moments
	blocks  [][]refSOAPBlock
	basis   func(param, blk int, l, r []float64, rr, rc int) (ql, qr []float64)
	qrBasis func(param, blk int, l, r, ql, qr []float64, rr, rc int) (nql, nqr []float64, pl, pr []int)
	stats   func(l, r []float64, rr, rc int)
}

// refQRStep is the power-iteration refresh of basis q (rows, n×n) for
// symmetric s with the row order perm (perm[k]: the old row that new row
// k refines): the rows q_perm[k]·s orthonormalised in descending k
// (Gram–Schmidt), and Lo's diagonal (how well each new row is
// determined). perm nil: the stable ascending order of the estimates
// q_i·s·q_iᵀ (opstest.RefSOAPBasis).
func refQRStep(s, q []float64, perm []int, n int) (out []float64, p []int, diag []float64) {
	if perm == nil {
		return opstest.RefSOAPBasis(s, q, n)
	}
	out, diag = opstest.RefSOAPBasisPerm(s, q, perm, n)
	return out, perm, diag
}

// permuteV is v (rr×rc) with rows and columns permuted: v'[r][c] =
// v[pl[r]][pr[c]].
func permuteV(v []float64, pl, pr []int, rr, rc int) []float64 {
	out := make([]float64, len(v))
	for r := 0; r < rr; r++ {
		for c := 0; c < rc; c++ {
			out[r*rc+c] = v[pl[r]*rc+pr[c]]
		}
	}
	return out
}

type refSOAPBlock struct {
	r0, c0, rr, rc int
	l, rs, ql, qr  []float64
	v              []float64 // second moment in the eigenbasis, rr×rc
}

func newRefSOAP(cfg optim.SOAPConfig, shapes [][]int, names []string) *refSOAP {
	r := &refSOAP{cfg: cfg, shapes: shapes, names: names}
	for _, sh := range shapes {
		n := tensorNumel(sh)
		r.m = append(r.m, make([]float64, n))
		r.av = append(r.av, make([]float64, n))
		var bs []refSOAPBlock
		if len(sh) == 2 {
			blk, _ := ops.NewBlocking(sh[0], sh[1], cfg.MaxBlock)
			for b := 0; b < blk.Count(); b++ {
				x := refSOAPBlock{r0: b / blk.Cols * blk.BR, c0: b % blk.Cols * blk.BC, rr: blk.RealRows(b), rc: blk.RealCols(b)}
				x.l, x.rs = make([]float64, x.rr*x.rr), make([]float64, x.rc*x.rc)
				x.ql, x.qr = eye(x.rr), eye(x.rc)
				x.v = make([]float64, x.rr*x.rc)
				bs = append(bs, x)
			}
		}
		r.blocks = append(r.blocks, bs)
	}
	return r
}

func tensorNumel(sh []int) int {
	n := 1
	for _, d := range sh {
		n *= d
	}
	return n
}

// eigRows is the eigenbasis of symmetric s (n×n) as rows, ascending.
func eigRows(s []float64, n int) []float64 {
	_, v := opstest.RefEigh(s, n)
	q := make([]float64, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			q[j*n+i] = v[i*n+j]
		}
	}
	return q
}

func (r *refSOAP) step(w, g [][]float64) {
	c := r.cfg
	r.t++
	b1, b2, bs, eps := float64(c.Beta1), float64(c.Beta2), float64(c.ShampooBeta), float64(c.Eps)
	if bs == 0 {
		bs = b2
	}
	lr, wd := float64(c.LR), float64(c.WeightDecay)
	refresh := (r.t-1)%c.UpdateFreq == 0
	first := r.t == 1     // statistics and bases only
	t := float64(r.t - 1) // updates so far: step 1 makes none
	for i := range w {
		if len(r.shapes[i]) != 2 { // AdamW
			if first {
				continue
			}
			for k, gv := range g[i] {
				r.m[i][k] = b1*r.m[i][k] + (1-b1)*gv
				r.av[i][k] = b2*r.av[i][k] + (1-b2)*gv*gv
				mh, vh := r.m[i][k]/(1-math.Pow(b1, t)), r.av[i][k]/(1-math.Pow(b2, t))
				w[i][k] -= lr * (mh/(math.Sqrt(vh)+eps) + wd*w[i][k])
			}
			continue
		}
		n := r.shapes[i][1]
		if !first {
			for k, gv := range g[i] {
				r.m[i][k] = b1*r.m[i][k] + (1-b1)*gv
			}
		}
		coef := math.Sqrt(1-math.Pow(b2, t)) / (1 - math.Pow(b1, t))
		step := make([]float64, len(w[i]))
		for bi := range r.blocks[i] {
			b := &r.blocks[i][bi]
			gb := sub(g[i], n, b.r0, b.c0, b.rr, b.rc)
			ggt := mul(gb, gb, b.rr, b.rr, b.rc, false, true)
			gtg := mul(gb, gb, b.rc, b.rc, b.rr, true, false)
			for k := range b.l {
				b.l[k] = bs*b.l[k] + (1-bs)*ggt[k]
			}
			for k := range b.rs {
				b.rs[k] = bs*b.rs[k] + (1-bs)*gtg[k]
			}
			if refresh && r.stats != nil {
				r.stats(b.l, b.rs, b.rr, b.rc)
			}
			switch {
			case refresh && (first || c.EighRefresh):
				if r.basis != nil {
					b.ql, b.qr = r.basis(i, bi, b.l, b.rs, b.rr, b.rc)
				} else {
					b.ql, b.qr = eigRows(b.l, b.rr), eigRows(b.rs, b.rc)
				}
			case refresh:
				var pl, pr []int
				if r.qrBasis != nil {
					b.ql, b.qr, pl, pr = r.qrBasis(i, bi, b.l, b.rs, b.ql, b.qr, b.rr, b.rc)
				} else {
					b.ql, pl, _ = refQRStep(b.l, b.ql, nil, b.rr)
					b.qr, pr, _ = refQRStep(b.rs, b.qr, nil, b.rc)
				}
				b.v = permuteV(b.v, pl, pr, b.rr, b.rc)
			}
			if first {
				continue
			}
			rot := func(x []float64) []float64 {
				return mul(mul(b.ql, x, b.rr, b.rc, b.rr, false, false), b.qr, b.rr, b.rc, b.rc, false, true)
			}
			gr, mr := rot(gb), rot(sub(r.m[i], n, b.r0, b.c0, b.rr, b.rc))
			nr := make([]float64, len(gr))
			for k := range gr {
				b.v[k] = b2*b.v[k] + (1-b2)*gr[k]*gr[k]
				nr[k] = mr[k] / (math.Sqrt(b.v[k]) + eps)
			}
			nb := mul(mul(b.ql, nr, b.rr, b.rc, b.rr, true, false), b.qr, b.rr, b.rc, b.rc, false, false)
			for x := 0; x < b.rr; x++ {
				for y := 0; y < b.rc; y++ {
					step[(b.r0+x)*n+b.c0+y] = nb[x*b.rc+y]
				}
			}
		}
		if first {
			continue
		}
		for k := range w[i] {
			w[i][k] -= lr * (coef*step[k] + wd*w[i][k])
		}
	}
}

// soapRun runs SOAP and the reference side by side for steps steps.
func soapRun(t *testing.T, cfg optim.SOAPConfig, shapes [][]int, steps int, inject bool) {
	t.Helper()
	p := hostProblem(t, shapes...)
	r := rand.New(rand.NewPCG(21, 22))
	w := roundF32(draws(r, 1, shapes))
	p.set(w)
	o, err := optim.NewSOAP(p.a, "run", p.params, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	names := p.names()
	ref := newRefSOAP(cfg, shapes, names)
	if inject {
		ref.basis = fedEigen(t, o, names, 1e-5)
		ref.qrBasis = fedQR(t, o, names, 1e-5)
	}
	for step := 1; step <= steps; step++ {
		g := roundF32(draws(r, 1, shapes))
		p.grads(g)
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
		ref.step(w, g)
		if e := relErr(p.values(), w); !(e < 2e-5) {
			t.Fatalf("step %d: relative error %.3g against the float64 reference", step, e)
		}
	}
}

// fedEigen supplies the reference with the device's eigenbases of block
// bi of param i (their real parts) at an eigendecomposition refresh, after
// checking that each diagonalises the reference statistics to tol.
func fedEigen(t *testing.T, o *optim.SOAP, names []string, tol float64) func(int, int, []float64, []float64, int, int) ([]float64, []float64) {
	return func(i, bi int, l, rs []float64, rr, rc int) ([]float64, []float64) {
		left, right, blk, ok := o.Basis(names[i])
		if !ok {
			t.Fatalf("no basis for %s", names[i])
		}
		lv, rv := opstest.F64(mustRead(t, left)), opstest.F64(mustRead(t, right))
		get := func(v []float64, d, n int, stat []float64) []float64 {
			q := make([]float64, 0, n*n)
			for x := 0; x < n; x++ {
				q = append(q, v[(bi*d+x)*d:(bi*d+x)*d+n]...)
			}
			checkDiagonalises(t, q, stat, n, tol)
			return q
		}
		return get(lv, blk.BR, rr, l), get(rv, blk.BC, rc, rs)
	}
}

// fedQR supplies the reference with the device's bases and permutations
// at a power-iteration refresh (blocks' real parts), after checking that
// the permutations are permutations of the real coordinates, that the
// bases are orthonormal (to tol), and that each basis row agrees with the
// reference's own refresh with the device's permutation
// (refQRStep from the bases in use) to 20·tol·max(Lo)/Lo_kk, for the rows
// with Lo_kk ≥ 0.05·max(Lo): the rows of a near-null space of
// rank-deficient statistics are rounding noise orthonormalised, arbitrary
// and different on every solver, so only their orthonormality is checked.
func fedQR(t *testing.T, o *optim.SOAP, names []string, tol float64) func(int, int, []float64, []float64, []float64, []float64, int, int) ([]float64, []float64, []int, []int) {
	return func(i, bi int, l, rs, ql, qr []float64, rr, rc int) ([]float64, []float64, []int, []int) {
		left, right, blk, ok := o.Basis(names[i])
		pl, pr, ok2 := o.Permutation(names[i])
		if !ok || !ok2 {
			t.Fatalf("no basis for %s", names[i])
		}
		lv, rv := opstest.F64(mustRead(t, left)), opstest.F64(mustRead(t, right))
		plv, prv := mustReadI32(t, pl), mustReadI32(t, pr)
		get := func(v []float64, pv []int32, d, n int, stat, prev []float64) ([]float64, []int) {
			q := make([]float64, 0, n*n)
			for x := 0; x < n; x++ {
				q = append(q, v[(bi*d+x)*d:(bi*d+x)*d+n]...)
			}
			perm := make([]int, n)
			seen := make([]bool, n)
			for k := range perm {
				perm[k] = int(pv[bi*d+k])
				if perm[k] < 0 || perm[k] >= n || seen[perm[k]] {
					t.Fatalf("%s block %d: permutation %v of %d real coordinates", names[i], bi, pv[bi*d:(bi+1)*d], n)
				}
				seen[perm[k]] = true
			}
			want, _, diag := refQRStep(stat, prev, perm, n)
			dmax := 0.0
			for _, x := range diag {
				dmax = math.Max(dmax, x)
			}
			var orth float64
			for x := 0; x < n; x++ {
				for y := 0; y < n; y++ {
					var dot float64
					for z := 0; z < n; z++ {
						dot += q[x*n+z] * q[y*n+z]
					}
					if x == y {
						dot--
					}
					orth += dot * dot
				}
				if diag[x] >= 0.05*dmax {
					if e := opstest.TermsErr(q[x*n:(x+1)*n], want[x*n:(x+1)*n], nil); !(e <= 20*tol*dmax/diag[x]) {
						t.Fatalf("%s block %d: refreshed basis row %d: relative error %.3g against the float64 refresh (Lo %.3g of %.3g)",
							names[i], bi, x, e, diag[x], dmax)
					}
				}
			}
			if math.Sqrt(orth) > math.Max(tol, 1e-4)*float64(n) {
				t.Fatalf("%s block %d: ‖Q·Qᵀ − I‖ = %.3g", names[i], bi, math.Sqrt(orth))
			}
			return q, perm
		}
		nql, npl := get(lv, plv, blk.BR, rr, l, ql)
		nqr, npr := get(rv, prv, blk.BC, rc, rs, qr)
		return nql, nqr, npl, npr
	}
}

func mustReadI32(t *testing.T, x *tensor.Tensor) []int32 {
	t.Helper()
	b, err := x.Read()
	if err != nil {
		t.Fatal(err)
	}
	return tensor.BytesAs[int32](b)
}

func mustRead(t *testing.T, x interface{ ReadFloat32() ([]float32, error) }) []float32 {
	t.Helper()
	v, err := x.ReadFloat32()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkDiagonalises fails unless q (rows orthonormal) makes q·s·qᵀ
// diagonal to tol of ‖s‖.
func checkDiagonalises(t *testing.T, q, s []float64, n int, tol float64) {
	t.Helper()
	d := mul(mul(q, s, n, n, n, false, false), q, n, n, n, false, true)
	off := 0.0
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if i != j {
				off += d[i*n+j] * d[i*n+j]
			}
		}
	}
	if math.Sqrt(off) > tol*frob(s)+1e-12 {
		t.Fatalf("the device's eigenbasis leaves %.3g off the diagonal of statistics of norm %.3g", math.Sqrt(off), frob(s))
	}
}

func testSOAPConfig() optim.SOAPConfig {
	c := optim.DefaultSOAP
	c.LR, c.UpdateFreq = 0.02, 3
	return c
}

// TestSOAPMatchesReference: SOAP against its float64 reference, on
// square full-rank blocks (whose eigenbases are unique, so the reference
// decomposes its own statistics) with a vector (AdamW); and on a matrix
// with padded, rectangular blocks, whose statistics are rank-deficient at
// the first refresh (eigenbases not unique): the reference takes the
// device's bases after checking that they diagonalise its statistics.
func TestSOAPMatchesReference(t *testing.T) {
	t.Run("square", func(t *testing.T) {
		cfg := testSOAPConfig()
		cfg.MaxBlock = 3
		soapRun(t, cfg, [][]int{{6, 6}, {4}, {4, 4}}, 7, false)
	})
	t.Run("padded", func(t *testing.T) {
		cfg := testSOAPConfig()
		cfg.MaxBlock = 3
		soapRun(t, cfg, [][]int{{7, 5}, {3}}, 7, true)
	})
	// The decomposition at every refresh (EighRefresh), and the power
	// iteration over more refreshes (steps 1, 3, …, 11).
	t.Run("eigh-refresh", func(t *testing.T) {
		cfg := testSOAPConfig()
		cfg.MaxBlock, cfg.EighRefresh = 3, true
		soapRun(t, cfg, [][]int{{6, 6}, {4}, {4, 4}}, 7, false)
		soapRun(t, cfg, [][]int{{7, 5}, {3}}, 7, true)
	})
	// Block shapes interleaved across parameters ([6,6] and [3,3] share
	// 3×3 blocks, stacked in one group; [7,5] and [2,6] give padded blocks
	// of other shapes in the same classes).
	t.Run("groups", func(t *testing.T) {
		cfg := testSOAPConfig()
		cfg.MaxBlock = 3
		soapRun(t, cfg, [][]int{{6, 6}, {4}, {7, 5}, {3, 3}, {2, 6}}, 7, true)
	})
	t.Run("square/many-refreshes", func(t *testing.T) {
		cfg := testSOAPConfig()
		cfg.MaxBlock, cfg.UpdateFreq = 4, 2
		soapRun(t, cfg, [][]int{{8, 4}, {4, 4}}, 12, false)
	})
}

// TestSOAPPowerIterationConverges: with the gradients drawn from one
// distribution (A·Z, A fixed with A·Aᵀ's eigenvalues 1, 4, …, 36, Z
// Gaussian) and ShampooBeta 0.999, the statistics settle (they move by
// about 1/t a step) and the power-iteration refreshes at every step
// (subspace iteration on slowly changing statistics) follow their
// eigenbasis: after 400 refreshes of a 6×6 block Q_L·L·Q_Lᵀ is diagonal
// to 1e-2 of ‖L‖ (1.1e-3 measured).
func TestSOAPPowerIterationConverges(t *testing.T) {
	const n = 6
	cfg := testSOAPConfig()
	cfg.MaxBlock, cfg.UpdateFreq, cfg.ShampooBeta, cfg.LR = n, 1, 0.999, 1e-3
	p := hostProblem(t, []int{n, n})
	r := rand.New(rand.NewPCG(5, 6))
	p.set(roundF32(draws(r, 1, [][]int{{n, n}})))
	o, err := optim.NewSOAP(p.a, "run", p.params, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	u := opstest.RandOrth(r, n)
	a := make([]float64, n*n) // A = U·diag(1..n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			a[i*n+j] = u[i*n+j] * float64(j+1)
		}
	}
	l := make([]float64, n*n)
	for step := 1; step <= 401; step++ {
		z := draws(r, 1, [][]int{{n, n}})[0]
		g := roundF32([][]float64{mul(a, z, n, n, n, false, false)})
		p.grads(g)
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
		ggt := mul(g[0], g[0], n, n, n, false, true)
		for k := range l {
			l[k] = 0.999*l[k] + 0.001*ggt[k]
		}
	}
	left, _, _, _ := o.Basis(p.params[0].Name)
	q := opstest.F64(mustRead(t, left))
	checkDiagonalises(t, q, l, n, 1e-2)
}

func soapMaker(mod func(c *optim.SOAPConfig)) maker {
	return func(t testing.TB, p *problem) optim.Optimizer {
		cfg := testSOAPConfig()
		cfg.MaxBlock = 3
		mod(&cfg)
		o, err := optim.NewSOAP(p.a, "run", p.params, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
}

var soapShapes = [][]int{{7, 5}, {3}, {4, 4}}

// TestSOAPAsyncZeroIsSync: asynchronous bases at staleness 0 give bitwise
// the parameters of synchronous ones; at staleness 2 they run.
func TestSOAPAsyncZeroIsSync(t *testing.T) {
	sync := runSteps(t, soapShapes, 3, 8, soapMaker(func(*optim.SOAPConfig) {}))
	async := runSteps(t, soapShapes, 3, 8, soapMaker(func(c *optim.SOAPConfig) { c.Roots.Async = true }))
	sameBits(t, "sync vs async", sync, async)
	runSteps(t, soapShapes, 3, 8, soapMaker(func(c *optim.SOAPConfig) { c.Roots.Async, c.Roots.MaxStaleness = true, 2 }))
}

// TestSOAPResume: exact resume, synchronous and asynchronous.
func TestSOAPResume(t *testing.T) {
	for _, stale := range []int{-1, 2} {
		checkResume(t, soapShapes, 8, soapMaker(func(c *optim.SOAPConfig) {
			if stale >= 0 {
				c.Roots.Async, c.Roots.MaxStaleness = true, stale
			}
		}))
	}
}

// TestSOAPResetStartsOver: after steps that include power-iteration
// refreshes (bases and permutations changed), Reset puts SOAP back where a
// new one starts: the same gradients from the same parameters give the
// same parameters, bit for bit.
func TestSOAPResetStartsOver(t *testing.T) {
	shapes := [][]int{{6, 6}, {4}, {5, 3}}
	cfg := optim.DefaultSOAP
	cfg.MaxBlock, cfg.UpdateFreq, cfg.LR = 3, 2, 0.02 // refreshes at 1, 3, 5: QR at 3 and 5
	r := rand.New(rand.NewPCG(31, 32))
	w0 := roundF32(draws(r, 1, shapes))
	var gs [][][]float64
	for range 6 {
		gs = append(gs, roundF32(draws(r, 1, shapes)))
	}
	run := func(p *problem, o optim.Optimizer) [][]float64 {
		p.set(w0)
		for _, g := range gs {
			p.grads(g)
			if err := o.Step(p.e); err != nil {
				t.Fatal(err)
			}
		}
		return p.values()
	}
	p := hostProblem(t, shapes...)
	o, err := optim.NewSOAP(p.a, "run", p.params, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	first := run(p, o)
	if err := o.Reset(p.e); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	again := run(p, o)
	q := hostProblem(t, shapes...)
	fresh, err := optim.NewSOAP(q.a, "run", q.params, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Free()
	want := run(q, fresh)
	for i := range want {
		if !slices.Equal(again[i], want[i]) {
			t.Fatalf("parameter %d after Reset: %v, a new SOAP: %v", i, again[i], want[i])
		}
		if !slices.Equal(first[i], want[i]) {
			t.Fatalf("parameter %d: the first run %v, a new SOAP %v (not deterministic)", i, first[i], want[i])
		}
	}
}
