package optim_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
)

// refSOAP is SOAP's published update (Vyas et al. 2024, Algorithm 1, with
// optim.SOAPConfig's order: statistics, then the basis, then the step) in
// float64 on the real part of every block, with AdamW (PyTorch's formula)
// for vectors. basis, when set, supplies the eigenbasis of a block at a
// refresh instead of the reference's own eigendecomposition (for blocks
// whose statistics are rank-deficient, where the eigenbasis is not
// unique); it gets the reference's statistics to check against.
type refSOAP struct {
	cfg    optim.SOAPConfig
	shapes [][]int
	names  []string
	t      int
	m      [][]float64 // first moments [M,N] (matrices), AdamW's (vectors)
	av     [][]float64 // AdamW's second moments
	blocks [][]refSOAPBlock
	basis  func(param, blk int, l, r []float64, rr, rc int) (ql, qr []float64)
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
			if refresh {
				if r.basis != nil {
					b.ql, b.qr = r.basis(i, bi, b.l, b.rs, b.rr, b.rc)
				} else {
					b.ql, b.qr = eigRows(b.l, b.rr), eigRows(b.rs, b.rc)
				}
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
	var names []string
	for _, q := range p.params {
		names = append(names, q.Name)
	}
	ref := newRefSOAP(cfg, shapes, names)
	if inject {
		// The device's eigenbasis of block bi of param i (its real part),
		// after checking that it diagonalises the reference statistics.
		ref.basis = func(i, bi int, l, rs []float64, rr, rc int) ([]float64, []float64) {
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
				checkDiagonalises(t, q, stat, n, 1e-5)
				return q
			}
			return get(lv, blk.BR, rr, l), get(rv, blk.BC, rc, rs)
		}
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
