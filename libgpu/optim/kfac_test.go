package optim_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/mat"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// meanLoss records L = (1/N)·Σ_rows Σ_j c_ij·y_ij for y [..., out] (rows
// N = numel/out): its gradient dL/dy = c/N is what a loss averaged over
// rows gives, as ops' cross-entropy.
func meanLoss(t *testing.T, g *ops.Graph, y *ops.Var, c []float32) {
	loss := g.NewOut("loss", tensor.F32, 1)
	out := y.Value.Dim(-1)
	n := float32(y.Value.Numel() / out)
	g.RecordLoss("loss", []*ops.Var{y}, loss, func(gr *ops.Grads) error {
		yv, err := y.Value.ReadFloat32()
		if err != nil {
			return err
		}
		var l float32
		for i := range yv {
			l += c[i] * yv[i] / n
		}
		if dy := gr.In(0); dy != nil {
			d := make([]float32, len(c))
			for i := range c {
				d[i] = c[i] / n
			}
			if err := dy.WriteFloat32(d); err != nil {
				return err
			}
		}
		return loss.Value.WriteFloat32([]float32{l})
	})
}

// TestKFACFactorsFromGraph: K-FAC's factors, fed by ops.GraphOptions'
// OnLinear hook from a two-layer graph, equal the explicit covariances of
// the captured activations (with the bias's 1) and of the per-example
// output gradients (N·∂L/∂y for a mean loss): overwritten at the first
// step, a moving average after it.
func TestKFACFactorsFromGraph(t *testing.T) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := device.Local{Dev: h}
	const in, hid, out = 4, 6, 3
	r := rand.New(rand.NewPCG(41, 42))
	params := []nn.Param{}
	mk := func(name string, shape ...int) nn.Param {
		v := opstest.Upload(t, a, tensor.Float32sOf(draws(r, 0.5, [][]int{shape})[0]), shape...)
		p := nn.Param{Name: name, Value: v, Grad: opstest.Empty(t, a, tensor.F32, shape...)}
		params = append(params, p)
		return p
	}
	w0, b0, w1 := mk("l0.weight", hid, in), mk("l0.bias", hid), mk("l1.weight", out, hid)
	cfg := optim.DefaultKFAC
	cfg.StatDecay = 0.8
	o, err := optim.NewKFAC(a, "run", params, []optim.KFACLayer{{Weight: "l0.weight", Bias: "l0.bias"}, {Weight: "l1.weight"}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	type seen struct{ x, dy []float64 }
	got := map[string]seen{}
	hook := o.OnLinear(e)
	xt := opstest.Empty(t, a, tensor.F32, 2, 5, in) // N = 10 rows
	g := ops.NewGraph(e, a, "run", ops.GraphOptions{OnLinear: func(weight string, x, dy *tensor.Tensor) error {
		xv, _ := x.ReadFloat32()
		dv, _ := dy.ReadFloat32()
		got[weight] = seen{opstest.F64(xv), opstest.F64(dv)}
		return hook(weight, x, dy)
	}})
	defer g.Free()
	hv := g.Linear(g.Input("x", xt), g.Param(w0.Name, w0.Value, w0.Grad), g.Param(b0.Name, b0.Value, b0.Grad), ops.ActGELU)
	yv := g.Linear(hv, g.Param(w1.Name, w1.Value, w1.Grad), nil, ops.ActNone)
	c := tensor.Float32sOf(draws(r, 1, [][]int{{2 * 5 * out}})[0])
	meanLoss(t, g, yv, c)
	if err := g.Build(true); err != nil {
		t.Fatal(err)
	}
	const n = 10
	prevA, prevG := map[string][]float64{}, map[string][]float64{}
	for step := 1; step <= 2; step++ {
		if err := xt.WriteFloat32(tensor.Float32sOf(draws(r, 1, [][]int{{n * in}})[0])); err != nil {
			t.Fatal(err)
		}
		if err := g.Forward(); err != nil {
			t.Fatal(err)
		}
		if err := g.Backward(); err != nil {
			t.Fatal(err)
		}
		if err := o.Step(e); err != nil {
			t.Fatal(err)
		}
		for _, l := range []struct {
			w    string
			d    int
			bias bool
		}{{"l0.weight", in, true}, {"l1.weight", hid, false}} {
			s, ok := got[l.w]
			if !ok {
				t.Fatalf("step %d: no capture for %s", step, l.w)
			}
			wantA := opstest.RefCov(s.x, n, l.d, l.bias)
			for i := range wantA {
				wantA[i] /= n
			}
			dout := len(s.dy) / n
			dy := make([]float64, len(s.dy))
			for i := range dy {
				dy[i] = n * s.dy[i] // per-example gradients
			}
			wantG := opstest.RefCov(dy, n, dout, false)
			for i := range wantG {
				wantG[i] /= n
			}
			if step > 1 {
				for i := range wantA {
					wantA[i] = 0.8*prevA[l.w][i] + 0.2*wantA[i]
				}
				for i := range wantG {
					wantG[i] = 0.8*prevG[l.w][i] + 0.2*wantG[i]
				}
			}
			at, gt := o.Factors(l.w)
			av, _ := at.ReadFloat32()
			gv, _ := gt.ReadFloat32()
			if e := opstest.TermsErr(opstest.F64(av), wantA, nil); !(e < 1e-5) {
				t.Errorf("step %d %s: A off by %.3g", step, l.w, e)
			}
			if e := opstest.TermsErr(opstest.F64(gv), wantG, nil); !(e < 1e-5) {
				t.Errorf("step %d %s: G off by %.3g", step, l.w, e)
			}
			prevA[l.w], prevG[l.w] = opstest.F64(av), opstest.F64(gv)
		}
	}
}

// kfacProblem is a static K-FAC problem: two layers (one with a bias),
// a vector outside them, and the layers' inputs and output gradients as
// tensors the test writes each step.
type kfacProblem struct {
	*problem
	x, dy []*tensor.Tensor
}

const kfacRows = 7

var kfacShapes = [][]int{{5, 4}, {5}, {3, 5}, {6}}

func newKFACProblem(t testing.TB) *kfacProblem {
	p := &kfacProblem{problem: hostProblem(t, kfacShapes...)}
	p.params[0].Name, p.params[1].Name, p.params[2].Name, p.params[3].Name = "l0.weight", "l0.bias", "l1.weight", "norm.weight"
	for _, sh := range [][2]int{{4, 5}, {5, 3}} {
		p.x = append(p.x, opstest.Empty(t, p.a, tensor.F32, kfacRows, sh[0]))
		p.dy = append(p.dy, opstest.Empty(t, p.a, tensor.F32, kfacRows, sh[1]))
	}
	return p
}

func (p *kfacProblem) layers() []optim.KFACLayer {
	return []optim.KFACLayer{{Weight: "l0.weight", Bias: "l0.bias", Input: p.x[0], OutGrad: p.dy[0]},
		{Weight: "l1.weight", Input: p.x[1], OutGrad: p.dy[1]}}
}

func testKFACConfig() optim.KFACConfig {
	c := optim.DefaultKFAC
	c.InvEvery, c.WeightDecay, c.Damping, c.KLClip = 2, 0.01, 0.01, 0.05
	return c
}

// refKFAC is K-FAC's published update in float64 (optim.KFACConfig's
// formulas).
type refKFAC struct {
	cfg       optim.KFACConfig
	a, g      [2][]float64
	ainv, gin [2][]float64
	buf       [][]float64
	t         int
}

func (r *refKFAC) step(w, grad [][]float64, x, dy [2][]float64) {
	c := r.cfg
	r.t++
	dims := [2][3]int{{5, 4, 1}, {3, 5, 0}} // out, in, bias
	rho := float64(c.StatDecay)
	for l := 0; l < 2; l++ {
		out, in, bias := dims[l][0], dims[l][1], dims[l][2] == 1
		ca := opstest.RefCov(x[l], kfacRows, in, bias)
		pe := make([]float64, len(dy[l]))
		for i := range pe {
			pe[i] = kfacRows * dy[l][i]
		}
		cg := opstest.RefCov(pe, kfacRows, out, false)
		for i := range ca {
			ca[i] /= kfacRows
			if r.t == 1 {
				r.a[l] = append(r.a[l], ca[i])
			} else {
				r.a[l][i] = rho*r.a[l][i] + (1-rho)*ca[i]
			}
		}
		for i := range cg {
			cg[i] /= kfacRows
			if r.t == 1 {
				r.g[l] = append(r.g[l], cg[i])
			} else {
				r.g[l][i] = rho*r.g[l][i] + (1-rho)*cg[i]
			}
		}
		din := in
		if bias {
			din++
		}
		if (r.t-1)%c.InvEvery == 0 {
			var ta, tg float64
			for i := 0; i < din; i++ {
				ta += r.a[l][i*din+i]
			}
			for i := 0; i < out; i++ {
				tg += r.g[l][i*out+i]
			}
			pi := math.Sqrt((ta / float64(din)) / (tg / float64(out)))
			sl := math.Sqrt(float64(c.Damping))
			r.ainv[l] = opstest.RefInverseRoot(r.a[l], din, 1, pi*sl)
			r.gin[l] = opstest.RefInverseRoot(r.g[l], out, 1, sl/pi)
		}
	}
	// Preconditioned gradients and the KL factor.
	var vs [2][]float64
	var sum float64
	gidx := [2][2]int{{0, 1}, {2, -1}}
	for l := 0; l < 2; l++ {
		out, in := dims[l][0], dims[l][1]
		din := in
		gm := make([]float64, 0)
		for i := 0; i < out; i++ {
			gm = append(gm, grad[gidx[l][0]][i*in:(i+1)*in]...)
			if gidx[l][1] >= 0 {
				gm = append(gm, grad[gidx[l][1]][i])
			}
		}
		if gidx[l][1] >= 0 {
			din++
		}
		vs[l] = mul(mul(r.gin[l], gm, out, din, out, false, false), r.ainv[l], out, din, din, false, false)
		for i := range gm {
			sum += vs[l][i] * gm[i]
		}
	}
	lr, mu, wd := float64(c.LR), float64(c.Momentum), float64(c.WeightDecay)
	nu := 1.0
	if q := lr * lr * sum; q > 0 {
		nu = math.Min(1, math.Sqrt(float64(c.KLClip)/q))
	}
	for l := 0; l < 2; l++ {
		out, in := dims[l][0], dims[l][1]
		din := in
		if gidx[l][1] >= 0 {
			din++
		}
		for i := 0; i < out; i++ {
			for j := 0; j < din; j++ {
				u := nu * vs[l][i*din+j]
				if j < in {
					pi, k := gidx[l][0], i*in+j
					r.buf[pi][k] = mu*r.buf[pi][k] + u + wd*w[pi][k]
					w[pi][k] -= lr * r.buf[pi][k]
				} else {
					pi := gidx[l][1]
					r.buf[pi][i] = mu*r.buf[pi][i] + u
					w[pi][i] -= lr * r.buf[pi][i]
				}
			}
		}
	}
	for k := range w[3] { // outside the layers: momentum SGD
		r.buf[3][k] = mu*r.buf[3][k] + grad[3][k] + wd*w[3][k]
		w[3][k] -= lr * r.buf[3][k]
	}
}

// TestKFACMatchesReference: K-FAC against its float64 reference on a
// static two-layer problem (factors from given inputs and output
// gradients, π-damped inverses every 2 steps, KL clipping, momentum).
func TestKFACMatchesReference(t *testing.T) {
	p := newKFACProblem(t)
	r := rand.New(rand.NewPCG(43, 44))
	w := roundF32(draws(r, 1, kfacShapes))
	p.set(w)
	cfg := testKFACConfig()
	o, err := optim.NewKFAC(p.a, "run", p.params, p.layers(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	ref := &refKFAC{cfg: cfg}
	for _, sh := range kfacShapes {
		ref.buf = append(ref.buf, make([]float64, tensorNumel(sh)))
	}
	for step := 1; step <= 5; step++ {
		var x, dy [2][]float64
		for l := 0; l < 2; l++ {
			x[l] = roundF32([][]float64{draws(r, 1, [][]int{p.x[l].Shape})[0]})[0]
			dy[l] = roundF32([][]float64{draws(r, 0.1, [][]int{p.dy[l].Shape})[0]})[0]
			if err := p.x[l].WriteFloat32(tensor.Float32sOf(x[l])); err != nil {
				t.Fatal(err)
			}
			if err := p.dy[l].WriteFloat32(tensor.Float32sOf(dy[l])); err != nil {
				t.Fatal(err)
			}
		}
		g := roundF32(draws(r, 1, kfacShapes))
		p.grads(g)
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
		ref.step(w, g, x, dy)
		if e := relErr(p.values(), w); !(e < 1e-4) {
			t.Fatalf("step %d: relative error %.3g against the float64 reference", step, e)
		}
	}
}

func kfacMaker(mod func(c *optim.KFACConfig)) maker {
	return func(t testing.TB, p *problem) optim.Optimizer {
		kp := &kfacProblem{problem: p}
		p.params[0].Name, p.params[1].Name, p.params[2].Name, p.params[3].Name = "l0.weight", "l0.bias", "l1.weight", "norm.weight"
		// Fixed inputs and output gradients (the same every step: the
		// factors' averages still move, from zero).
		rr := rand.New(rand.NewPCG(45, 46))
		for _, sh := range [][2]int{{4, 5}, {5, 3}} {
			kp.x = append(kp.x, opstest.Upload(t, p.a, tensor.Float32sOf(draws(rr, 1, [][]int{{kfacRows * sh[0]}})[0]), kfacRows, sh[0]))
			kp.dy = append(kp.dy, opstest.Upload(t, p.a, tensor.Float32sOf(draws(rr, 0.1, [][]int{{kfacRows * sh[1]}})[0]), kfacRows, sh[1]))
		}
		cfg := testKFACConfig()
		mod(&cfg)
		o, err := optim.NewKFAC(p.a, "run", p.params, kp.layers(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
}

// TestKFACAsyncAndResume: asynchronous inverses at staleness 0 equal
// synchronous ones bitwise; runs resume exactly (synchronous, and with a
// refresh in flight).
func TestKFACAsyncAndResume(t *testing.T) {
	sameBits(t, "sync vs async", runSteps(t, kfacShapes, 5, 7, kfacMaker(func(*optim.KFACConfig) {})),
		runSteps(t, kfacShapes, 5, 7, kfacMaker(func(c *optim.KFACConfig) { c.Roots.Async = true })))
	for _, stale := range []int{-1, 2} {
		checkResume(t, kfacShapes, 7, kfacMaker(func(c *optim.KFACConfig) {
			c.Roots.Method = ops.RootNewton
			if stale >= 0 {
				c.Roots.Async, c.Roots.MaxStaleness = true, stale
			}
		}))
	}
}

// TestKFACTrainsMLP: K-FAC on an nn.MLP (factors from nn.MLP.Linears, no
// hook) lowers the loss on a separable problem.
func TestKFACTrainsMLP(t *testing.T) {
	const batch, classes, dim = 32, 4, 8
	m, e, a := newModel(t, nn.MLPConfig{Widths: []int{dim, 16, classes}, Act: ops.ActReLU, Batch: batch, Seed: 3})
	var layers []optim.KFACLayer
	for _, l := range m.Linears() {
		layers = append(layers, optim.KFACLayer{Weight: l.Weight, Bias: l.Bias, Input: l.Input, OutGrad: l.OutGrad})
	}
	cfg := optim.DefaultKFAC
	cfg.LR = 0.05
	o, err := optim.NewKFAC(a, "run", m.Params(), layers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	b := newBlobs(7, classes, dim)
	var first, last float32
	for step := 0; step < 60; step++ {
		x, y := b.batch(batch)
		load(t, m, x, y)
		if err := m.Forward(e); err != nil {
			t.Fatal(err)
		}
		l, _ := m.Loss().ReadF32()
		if step == 0 {
			first = l[0]
		}
		last = l[0]
		if err := m.Backward(e); err != nil {
			t.Fatal(err)
		}
		if err := o.Step(e); err != nil {
			t.Fatal(err)
		}
	}
	if !(last < 0.5*first) {
		t.Errorf("loss %v → %v", first, last)
	}
}

// TestKFACOneLayerIsGaussNewton: for one Linear layer y = W·x + b under
// the squared loss L = (1/2N)·Σ_n |y_n − t_n|², the Fisher of the
// Gaussian model (= the Gauss–Newton matrix) is exactly A ⊗ I with A =
// (1/N)·Σ āāᵀ (ā = [x, 1]): the output factor of the true Fisher is
// E[ggᵀ] = I, independent of the inputs, so the Kronecker factorisation
// is exact (Martens & Grosse 2015, §3). K-FAC fed that G (here from
// output gradients whose covariance is I), with damping → 0, LR 1, no
// momentum and no KL clipping, then takes the exact Gauss–Newton step,
// which for a linear least-squares problem lands on its solution: checked
// against the normal equations solved in float64, independently of
// K-FAC's own formulas.
func TestKFACOneLayerIsGaussNewton(t *testing.T) {
	const in, out, k = 6, 3, 8
	const n = out * k // rows
	p := hostProblem(t, []int{out, in}, []int{out})
	p.params[0].Name, p.params[1].Name = "fc.weight", "fc.bias"
	r := rand.New(rand.NewPCG(47, 48))
	xs := roundF32(draws(r, 1, [][]int{{n, in}}))[0]
	ts := draws(r, 1, [][]int{{n, out}})[0]
	w := roundF32(draws(r, 0.5, [][]int{{out, in}, {out}}))
	p.set(w)
	// The exact gradient of L at w.
	gw, gb := make([]float64, out*in), make([]float64, out)
	for row := 0; row < n; row++ {
		for i := 0; i < out; i++ {
			y := w[1][i]
			for j := 0; j < in; j++ {
				y += w[0][i*in+j] * xs[row*in+j]
			}
			res := (y - ts[row*out+i]) / n
			for j := 0; j < in; j++ {
				gw[i*in+j] += res * xs[row*in+j]
			}
			gb[i] += res
		}
	}
	p.grads([][]float64{gw, gb})
	// Output gradients with (1/N)·Σ ggᵀ = I (GradScale 1): row n is
	// √out·e_(n mod out).
	dy := make([]float64, n*out)
	for row := 0; row < n; row++ {
		dy[row*out+row%out] = math.Sqrt(out)
	}
	x := opstest.Upload(t, p.a, tensor.Float32sOf(xs), n, in)
	g := opstest.Upload(t, p.a, tensor.Float32sOf(dy), n, out)
	cfg := optim.KFACConfig{LR: 1, Damping: 1e-12, StatDecay: 0.5, CovEvery: 1, InvEvery: 1, GradScale: 1}
	o, err := optim.NewKFAC(p.a, "run", p.params, []optim.KFACLayer{{Weight: "fc.weight", Bias: "fc.bias", Input: x, OutGrad: g}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	if err := o.Step(p.e); err != nil {
		t.Fatal(err)
	}
	// Least squares: Θ = [W | b] solves Θ·(ĀᵀĀ) = TᵀĀ.
	abar := mat.NewDense(n, in+1, nil)
	for row := 0; row < n; row++ {
		for j := 0; j < in; j++ {
			abar.Set(row, j, xs[row*in+j])
		}
		abar.Set(row, in, 1)
	}
	var ata, tta, theta mat.Dense
	ata.Mul(abar.T(), abar)
	tta.Mul(mat.NewDense(n, out, ts).T(), abar)
	if err := theta.Solve(&ata, tta.T()); err != nil { // ĀᵀĀ·Θᵀ = ĀᵀT
		t.Fatal(err)
	}
	want := [][]float64{make([]float64, out*in), make([]float64, out)}
	for i := 0; i < out; i++ {
		for j := 0; j < in; j++ {
			want[0][i*in+j] = theta.At(j, i)
		}
		want[1][i] = theta.At(in, i)
	}
	if e := relErr(p.values(), want); !(e < 1e-4) {
		t.Errorf("one K-FAC step lands %.3g (relative) away from the least-squares solution", e)
	}
}
