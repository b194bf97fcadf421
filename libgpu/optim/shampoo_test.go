package optim_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// refShampoo is Shampoo's published update (Gupta et al. 2018, Anil et
// al. 2020, with the grafting of Agarwal et al. 2020) in float64, on the
// real part of every block (no padding), with roots by exact
// eigendecomposition and the staleness schedule of optim.RootOptions.
type refShampoo struct {
	cfg      optim.ShampooConfig
	shapes   [][]int
	m, v     [][]float64
	blocks   [][]refBlock
	t        int
	pendingT int
}

type refBlock struct {
	r0, c0, rr, rc int
	l, rs          []float64 // statistics
	pl, pr         []float64 // roots in use
	nl, nr         []float64 // roots computed, not in use yet
}

func newRefShampoo(cfg optim.ShampooConfig, shapes [][]int) *refShampoo {
	r := &refShampoo{cfg: cfg, shapes: shapes}
	for _, sh := range shapes {
		m, n := sh[0], 1
		if len(sh) == 1 {
			m, n = 1, sh[0]
		} else {
			n = sh[1]
		}
		r.m = append(r.m, make([]float64, m*n))
		r.v = append(r.v, make([]float64, m*n))
		var bs []refBlock
		if len(sh) >= 2 && !matchesAny(cfg.GraftOnly) {
			blk, _ := ops.NewBlocking(m, n, cfg.MaxBlock)
			for b := 0; b < blk.Count(); b++ {
				rb := refBlock{r0: b / blk.Cols * blk.BR, c0: b % blk.Cols * blk.BC, rr: blk.RealRows(b), rc: blk.RealCols(b)}
				rb.l, rb.rs = make([]float64, rb.rr*rb.rr), make([]float64, rb.rc*rb.rc)
				rb.pl, rb.pr = eye(rb.rr), eye(rb.rc)
				bs = append(bs, rb)
			}
		}
		r.blocks = append(r.blocks, bs)
	}
	return r
}

func matchesAny([]string) bool { return false }

func eye(n int) []float64 {
	x := make([]float64, n*n)
	for i := 0; i < n; i++ {
		x[i*n+i] = 1
	}
	return x
}

func (r *refShampoo) step(w, g [][]float64) {
	c := r.cfg
	r.t++
	t := float64(r.t)
	b1, b2 := float64(c.Beta1), float64(c.Beta2)
	for i := range w {
		n := 1
		if len(r.shapes[i]) == 2 {
			n = r.shapes[i][1]
		} else {
			n = r.shapes[i][0]
		}
		for bi := range r.blocks[i] {
			b := &r.blocks[i][bi]
			gb := sub(g[i], n, b.r0, b.c0, b.rr, b.rc)
			ggt := mul(gb, gb, b.rr, b.rr, b.rc, false, true)
			gtg := mul(gb, gb, b.rc, b.rc, b.rr, true, false)
			for k := range b.l {
				if b2 == 1 {
					b.l[k] += ggt[k]
				} else {
					b.l[k] = b2*b.l[k] + (1-b2)*ggt[k]
				}
			}
			for k := range b.rs {
				if b2 == 1 {
					b.rs[k] += gtg[k]
				} else {
					b.rs[k] = b2*b.rs[k] + (1-b2)*gtg[k]
				}
			}
		}
	}
	lag := 0
	if c.Roots.Async {
		lag = c.Roots.MaxStaleness
	}
	if r.pendingT > 0 && r.t >= r.pendingT+lag {
		r.publish()
	}
	if r.t >= c.StartStep && (r.t-c.StartStep)%c.UpdateFreq == 0 {
		for i := range r.blocks {
			for bi := range r.blocks[i] {
				b := &r.blocks[i][bi]
				b.nl = symRoot(b.l, b.rr, 4, float64(c.MatrixEps)+float64(c.MatrixRelEps)*frob(b.l))
				b.nr = symRoot(b.rs, b.rc, 4, float64(c.MatrixEps)+float64(c.MatrixRelEps)*frob(b.rs))
			}
		}
		r.pendingT = r.t
		if lag == 0 {
			r.publish()
		}
	}
	ready := r.t >= c.StartStep+lag
	for i := range w {
		mh, a := make([]float64, len(w[i])), make([]float64, len(w[i]))
		for k, gv := range g[i] {
			mh[k] = gv
			if c.Beta1 > 0 {
				r.m[i][k] = b1*r.m[i][k] + (1-b1)*gv
				mh[k] = r.m[i][k] / (1 - math.Pow(b1, t))
			}
			var vh float64
			if c.AdaGradGraft {
				r.v[i][k] += gv * gv
				vh = r.v[i][k]
			} else {
				gb2 := float64(c.GraftBeta2)
				r.v[i][k] = gb2*r.v[i][k] + (1-gb2)*gv*gv
				vh = r.v[i][k] / (1 - math.Pow(gb2, t))
			}
			a[k] = mh[k] / (math.Sqrt(vh) + float64(c.GraftEps))
		}
		d := a
		if ready && len(r.blocks[i]) > 0 {
			d = make([]float64, len(a))
			n := r.shapes[i][1]
			for bi := range r.blocks[i] {
				b := &r.blocks[i][bi]
				mb := sub(mh, n, b.r0, b.c0, b.rr, b.rc)
				ab := sub(a, n, b.r0, b.c0, b.rr, b.rc)
				s := mul(mul(b.pl, mb, b.rr, b.rc, b.rr, false, false), b.pr, b.rr, b.rc, b.rc, false, false)
				scale := 0.0
				if ns := frob(s); ns > 0 {
					scale = frob(ab) / ns
				}
				for x := 0; x < b.rr; x++ {
					for y := 0; y < b.rc; y++ {
						d[(b.r0+x)*n+b.c0+y] = scale * s[x*b.rc+y]
					}
				}
			}
		}
		lr, wd := float64(c.LR), float64(c.WeightDecay)
		for k := range w[i] {
			w[i][k] -= lr * (d[k] + wd*w[i][k])
		}
	}
}

func (r *refShampoo) publish() {
	for i := range r.blocks {
		for bi := range r.blocks[i] {
			b := &r.blocks[i][bi]
			b.pl, b.pr = b.nl, b.nr
		}
	}
	r.pendingT = 0
}

// sub is the rr×rc block at (r0, c0) of the n-column x.
func sub(x []float64, n, r0, c0, rr, rc int) []float64 {
	out := make([]float64, 0, rr*rc)
	for i := 0; i < rr; i++ {
		out = append(out, x[(r0+i)*n+c0:(r0+i)*n+c0+rc]...)
	}
	return out
}

var shampooShapes = [][]int{{7, 5}, {4}, {3, 3}}

func testShampooConfig() optim.ShampooConfig {
	c := optim.DefaultShampoo
	c.LR, c.WeightDecay, c.MaxBlock = 0.05, 0.01, 3
	c.StartStep, c.UpdateFreq = 2, 2
	c.MatrixRelEps = 1e-3
	return c
}

// TestShampooMatchesReference runs Shampoo (eigendecomposition roots) on
// small random problems against its float64 reference: blocks that do not
// tile the matrix, a vector (graft only), β2 < 1 and = 1 (AdaGrad
// statistics), Adam and AdaGrad grafts, and asynchronous roots with
// staleness 0 and 1.
func TestShampooMatchesReference(t *testing.T) {
	for _, v := range []struct {
		name string
		mod  func(c *optim.ShampooConfig)
	}{
		{"adam-graft", func(*optim.ShampooConfig) {}},
		{"adagrad", func(c *optim.ShampooConfig) { c.Beta2, c.AdaGradGraft, c.Beta1 = 1, true, 0 }},
		{"async-0", func(c *optim.ShampooConfig) { c.Roots.Async = true }},
		{"async-1", func(c *optim.ShampooConfig) { c.Roots.Async, c.Roots.MaxStaleness = true, 1 }},
		{"async-2", func(c *optim.ShampooConfig) { c.Roots.Async, c.Roots.MaxStaleness = true, 2 }},
	} {
		t.Run(v.name, func(t *testing.T) {
			cfg := testShampooConfig()
			v.mod(&cfg)
			p := hostProblem(t, shampooShapes...)
			r := rand.New(rand.NewPCG(3, 4))
			w := roundF32(draws(r, 1, shampooShapes))
			p.set(w)
			o, err := optim.NewShampoo(p.a, "run", p.params, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Free()
			ref := newRefShampoo(cfg, shampooShapes)
			for step := 1; step <= 7; step++ {
				g := roundF32(draws(r, 1, shampooShapes))
				p.grads(g)
				if err := o.Step(p.e); err != nil {
					t.Fatal(err)
				}
				ref.step(w, g)
				if e := relErr(p.values(), w); !(e < 2e-5) {
					t.Fatalf("step %d: relative error %.3g against the float64 reference", step, e)
				}
			}
		})
	}
}

// TestShampooNewtonMatchesEigen: Newton roots give the same steps as
// eigendecomposition roots to the roots' accuracy.
func TestShampooNewtonMatchesEigen(t *testing.T) {
	run := func(m ops.RootMethod) [][]float64 {
		cfg := testShampooConfig()
		cfg.Roots.Method = m
		p := hostProblem(t, shampooShapes...)
		r := rand.New(rand.NewPCG(5, 6))
		p.set(draws(r, 1, shampooShapes))
		o, err := optim.NewShampoo(p.a, "run", p.params, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer o.Free()
		for step := 0; step < 6; step++ {
			p.grads(draws(r, 1, shampooShapes))
			if err := o.Step(p.e); err != nil {
				t.Fatal(err)
			}
		}
		if s := o.RootStats(); s.Failures != 0 || s.Refreshes != 3 {
			t.Errorf("%v: root stats %+v", m, s)
		}
		return p.values()
	}
	if e := relErr(run(ops.RootNewton), run(ops.RootEigen)); !(e < 1e-4) {
		t.Errorf("Newton vs eigen roots: relative difference %.3g", e)
	}
}

// TestShampooAsyncZeroIsSync: asynchronous roots with staleness 0 give
// bitwise the parameters of synchronous roots.
//
// Refreshes after the second of each job replay its captured side-stream
// work (on the host the "graph" is the function itself): at 9 steps with
// refreshes at 2, 4, 6 and 8, the last two are replays.
func TestShampooAsyncZeroIsSync(t *testing.T) {
	var last *optim.Shampoo
	mk := func(async bool) maker {
		return func(t testing.TB, p *problem) optim.Optimizer {
			cfg := testShampooConfig()
			cfg.Roots.Async, cfg.Roots.Method = async, ops.RootNewton
			o, err := optim.NewShampoo(p.a, "run", p.params, cfg)
			if err != nil {
				t.Fatal(err)
			}
			last = o
			return o
		}
	}
	sameBits(t, "sync vs async", runSteps(t, shampooShapes, 7, 9, mk(false)), runSteps(t, shampooShapes, 7, 9, mk(true)))
	st := last.RootStats()
	if st.Refreshes != 4 || st.Replayed == 0 || st.Replayed%2 != 0 || st.Uncaptured != 0 {
		t.Errorf("roots %+v: want 4 refreshes, the last 2 replayed for every job", st)
	}
}

// TestShampooResume: exact resume, also with an asynchronous refresh in
// flight at the stop.
func TestShampooResume(t *testing.T) {
	for _, stale := range []int{-1, 0, 2} {
		checkResume(t, shampooShapes, 8, func(t testing.TB, p *problem) optim.Optimizer {
			cfg := testShampooConfig()
			if stale >= 0 {
				cfg.Roots.Async, cfg.Roots.MaxStaleness = true, stale
			}
			o, err := optim.NewShampoo(p.a, "run", p.params, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return o
		})
	}
}

// TestShampooRootFailure: a block whose statistics become NaN fails its
// root refresh: the block keeps its previous root (the parameters stay
// finite), the failure is read at the next refresh and the job switches to
// float64 eigendecomposition, a switch kept in the state (a resumed run
// reads it back). Once the statistics are sound again, the job returns to
// Newton's roots after f64Hold refreshes in float64, and stays there.
func TestShampooRootFailure(t *testing.T) {
	cfg := testShampooConfig()
	cfg.Roots.Method = ops.RootNewton
	p := hostProblem(t, shampooShapes...)
	r := rand.New(rand.NewPCG(13, 14))
	p.set(draws(r, 1, shampooShapes))
	o, err := optim.NewShampoo(p.a, "run", p.params, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	step := func() {
		t.Helper()
		p.grads(draws(r, 1, shampooShapes))
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
	}
	step()
	step() // roots computed at step 2
	// Poison one matrix of a statistics stack (the last block of order 3).
	var sound []float32
	for _, s := range o.State() {
		if s.Name == "shampoo/d3.stats" {
			v, _ := s.Value.ReadFloat32()
			sound = append([]float32(nil), v...)
			v[len(v)-1] = float32(math.NaN())
			s.Value.WriteFloat32(v)
		}
	}
	for i := 0; i < 5; i++ { // refreshes at steps 4 and 6
		step()
	}
	st := o.RootStats()
	if st.Failures == 0 || st.F64 != 1 {
		t.Errorf("root stats %+v, want failures and one job in float64", st)
	}
	for i, v := range p.values() {
		for _, x := range v {
			if math.IsNaN(x) {
				t.Fatalf("param %d has a NaN: the failed root was used", i)
			}
		}
	}
	f64State := func() int32 {
		for _, s := range o.State() {
			if s.Name == "shampoo/d3.f64" {
				b, _ := s.Value.Read()
				return tensor.BytesAs[int32](b)[0]
			}
		}
		t.Fatal("no shampoo/d3.f64 in the state")
		return 0
	}
	if v := f64State(); v != 6 {
		t.Errorf("the float64 switch is not in the state: %d, want the refresh's step 6", v)
	}
	// Sound statistics again; the switch holds for f64Hold refreshes (10,
	// every 2 steps: until step 26), then Newton's roots come back and
	// succeed (no new failure, no second switch).
	for _, s := range o.State() {
		if s.Name == "shampoo/d3.stats" {
			s.Value.WriteFloat32(sound)
		}
	}
	for i := 0; i < 18; i++ { // to step 25
		step()
	}
	if st := o.RootStats(); st.Retried != 0 || f64State() != 6 {
		t.Errorf("root stats %+v, switch %d: retried before f64Hold refreshes", st, f64State())
	}
	for i := 0; i < 6; i++ { // to step 31: the retry at 26, its status read at 28
		step()
	}
	st2 := o.RootStats()
	if st2.Retried != 1 || st2.F64 != 1 || st2.Failures != st.Failures || f64State() != 0 {
		t.Errorf("root stats %+v (before %+v), switch %d: want one retry, no new failure or switch", st2, st, f64State())
	}
}

// TestShampooFirstRootFailure: a root that fails at the first refresh —
// there is no earlier root to keep, only the identities the roots start
// as — does not silently change the update: the refresh's status is read
// at once and the job recomputed by float64 eigendecomposition before the
// roots are used, so a run whose Newton roots all fail (one iteration:
// far from converged, δ ≫ 1) steps bitwise as a run with eigen roots
// (on the host, both decompose in float64), synchronously and with
// asynchronous roots (in flight at a stop and resumed, too), and says so
// in its RootStats.
func TestShampooFirstRootFailure(t *testing.T) {
	mk := func(m ops.RootMethod, async bool, stale int) maker {
		return func(t testing.TB, p *problem) optim.Optimizer {
			cfg := testShampooConfig()
			cfg.Roots.Method, cfg.Roots.NewtonIters = m, 1
			cfg.Roots.Async, cfg.Roots.MaxStaleness = async, stale
			o, err := optim.NewShampoo(p.a, "run", p.params, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
	}
	for _, c := range []struct {
		async bool
		stale int
	}{{false, 0}, {true, 0}, {true, 2}} {
		t.Run(fmt.Sprintf("async=%v,stale=%d", c.async, c.stale), func(t *testing.T) {
			var o *optim.Shampoo
			newton := runSteps(t, shampooShapes, 3, 7, func(t testing.TB, p *problem) optim.Optimizer {
				o = mk(ops.RootNewton, c.async, c.stale)(t, p).(*optim.Shampoo)
				return o
			})
			stats := o.RootStats()
			sameBits(t, "failed Newton roots vs eigen roots", newton, runSteps(t, shampooShapes, 3, 7, mk(ops.RootEigen, c.async, c.stale)))
			// Blocks of order 3 (7×5 in 3×3 blocks and 3×3) and 1 (the 7×5
			// blocks' last row) form the classes; each fails and switches.
			if stats.Failures == 0 || stats.F64 == 0 {
				t.Errorf("root stats %+v: the failures were not counted", stats)
			}
		})
	}
	checkResume(t, shampooShapes, 8, mk(ops.RootNewton, true, 2))
}
