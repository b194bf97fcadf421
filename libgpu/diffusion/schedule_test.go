package diffusion

import (
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func TestSchedules(t *testing.T) {
	l := Linear(1000)
	if l.Betas[0] != 1e-4 || math.Abs(l.Betas[999]-0.02) > 1e-15 {
		t.Errorf("linear β from %v to %v, want 1e-4 to 0.02", l.Betas[0], l.Betas[999])
	}
	// ᾱ_T of DDPM's schedule: about 4.0e-5 (Ho et al. 2020's L_T ≈ 1e-5 bits).
	if ab := l.AlphaBar[999]; ab < 3e-5 || ab > 5e-5 {
		t.Errorf("linear ᾱ_T = %v", ab)
	}
	c := Cosine(1000)
	for i, b := range c.Betas {
		if !(b > 0 && b <= 0.999) {
			t.Fatalf("cosine β_%d = %v", i, b)
		}
		if i > 0 && !(c.AlphaBar[i] < c.AlphaBar[i-1]) {
			t.Fatalf("cosine ᾱ not decreasing at %d", i)
		}
	}
	// f(1)/f(0) for s = 0.008 (Nichol & Dhariwal's eq. 17).
	f := func(t float64) float64 { return math.Pow(math.Cos((t/1000+0.008)/1.008*math.Pi/2), 2) }
	if want := f(1) / f(0); math.Abs(c.AlphaBar[0]-want) > 1e-12 {
		t.Errorf("cosine ᾱ_0 = %v, want %v", c.AlphaBar[0], want)
	}
	if _, err := NewSchedule("quadratic", 1000); err == nil {
		t.Error("an unknown schedule was accepted")
	}
}

func TestTimesteps(t *testing.T) {
	all, err := Timesteps(1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range all {
		if v != 999-i {
			t.Fatalf("1000 steps: t_%d = %d", i, v)
		}
	}
	ts, _ := Timesteps(1000, 20)
	if ts[0] != 999 || ts[19] != 49 {
		t.Errorf("20 steps: %v", ts)
	}
	for i := 1; i < len(ts); i++ {
		if ts[i] >= ts[i-1] {
			t.Fatalf("not decreasing: %v", ts)
		}
	}
	if h, _ := Timesteps(500, 4); h[0] != 499 || h[3] != 124 {
		t.Errorf("4 steps from 500: %v", h)
	}
	if _, err := Timesteps(10, 11); err == nil {
		t.Error("more steps than timesteps accepted")
	}
}

// host makes a host engine and a tensor helper.
func host(t *testing.T) (*ops.Engine, func(dt tensor.DType, v []float32, shape ...int) *tensor.Tensor) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := device.Local{Dev: h}
	return e, func(dt tensor.DType, v []float32, shape ...int) *tensor.Tensor {
		x, err := tensor.Alloc(a, "", dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		if v != nil {
			if err := x.WriteFloat32(v); err != nil {
				t.Fatal(err)
			}
		}
		return x
	}
}

// runPlan runs p on the host through the real ops, with eps(x, step) as
// the model (one pass), from x0 (the start row's noise when nil), and
// returns the samples.
func runPlan(t *testing.T, p *Plan, n int, seed uint64, eps func(x []float32, ti, step int) []float32) []float32 {
	t.Helper()
	e, mk := host(t)
	x := mk(tensor.F32, nil, n)
	d := mk(tensor.F32, make([]float32, n), n)
	ep := mk(tensor.F32, nil, n)
	coef := mk(tensor.F32, p.Table(), len(p.Rows), ops.CoefWidth)
	st := ops.DiffusionStep{X: x, Coef: coef, Seed: seed}
	if err := e.DiffusionStart(st); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(p.Rows); i++ {
		xv, _ := x.F32()
		if err := ep.WriteF32(eps(xv, p.Timesteps[i-1], i)); err != nil {
			t.Fatal(err)
		}
		step := st
		step.D, step.Eps, step.Row, step.Stream = d, ep, i, uint32(i)
		if err := e.DiffusionStep(step); err != nil {
			t.Fatal(err)
		}
	}
	out, _ := x.F32()
	return append([]float32(nil), out...)
}

// TestPlansFollowThePapers runs every scheduler's plan through the fused
// step (host backend) on a toy model and compares the whole chain with
// each paper's own form of the update in float64: DDPM's eq. 11 mean
// 1/√α_t·(x_t − β_t/√(1−ᾱ_t)·ε) and posterior σ² = β̃ (respaced), DDIM's
// eq. 12, and DPM-Solver++(2M)'s Algorithm 2 with e^(−h) (first order at
// the first and last steps). The noise z is the same NormalAt draws.
func TestPlansFollowThePapers(t *testing.T) {
	const n, seed = 64, 5
	s := Linear(1000)
	model := func(x float64, ti int) float64 { return 0.7*math.Tanh(x) + 0.001*float64(ti%7) }
	eps := func(x []float32, ti, _ int) []float32 {
		out := make([]float32, len(x))
		for i, v := range x {
			out[i] = float32(model(float64(v), ti))
		}
		return out
	}
	for _, c := range []struct {
		sch   Scheduler
		steps int
		eta   float64
	}{{DDPM, 10, 0}, {DDPM, 1000, 0}, {DDIM, 10, 0}, {DDIM, 25, 0.5}, {DPMSolverPP, 1, 0}, {DPMSolverPP, 2, 0}, {DPMSolverPP, 12, 0}} {
		p, err := NewPlan(s, PlanOptions{Scheduler: c.sch, Steps: c.steps, Eta: c.eta, Guidance: 1, NoClip: true})
		if err != nil {
			t.Fatal(err)
		}
		got := runPlan(t, p, n, seed, eps)
		// The reference chain, in float64 from the same start.
		x := make([]float64, n)
		for i := range x {
			x[i] = float64(ops.NormalAt(seed, 0, 0, int64(i)))
		}
		ts := p.Timesteps
		ab := func(i int) float64 {
			if i >= len(ts) {
				return 1
			}
			return s.AlphaBar[ts[i]]
		}
		var prevX0 []float64
		for i := range ts {
			a, an := ab(i), ab(i+1)
			x0 := make([]float64, n)
			for j := range x {
				e := model(x[j], ts[i])
				z := float64(ops.NormalAt(seed, uint32(i+1), 0, int64(j)))
				x0[j] = (x[j] - math.Sqrt(1-a)*e) / math.Sqrt(a)
				switch c.sch {
				case DDPM:
					alpha := a / an // α_t of the respaced chain
					beta := 1 - alpha
					sig := math.Sqrt(beta * (1 - an) / (1 - a))
					x[j] = (x[j]-beta/math.Sqrt(1-a)*e)/math.Sqrt(alpha) + sig*z
				case DDIM:
					sig := c.eta * math.Sqrt((1-an)/(1-a)*(1-a/an))
					x[j] = math.Sqrt(an)*x0[j] + math.Sqrt(1-an-sig*sig)*e + sig*z
				case DPMSolverPP:
					lam := func(v float64) float64 { return math.Log(math.Sqrt(v) / math.Sqrt(1-v)) }
					if i+1 == len(ts) { // to σ = 0: e^(−h) = 0
						x[j] = x0[j]
						continue
					}
					h := lam(an) - lam(a)
					D := x0[j]
					if i > 0 {
						r := (lam(a) - lam(ab(i-1))) / h
						D = (1+1/(2*r))*x0[j] - 1/(2*r)*prevX0[j]
					}
					x[j] = math.Sqrt(1-an)/math.Sqrt(1-a)*x[j] - math.Sqrt(an)*(math.Exp(-h)-1)*D
				}
			}
			prevX0 = x0
		}
		var num, den float64
		for j := range x {
			num += (float64(got[j]) - x[j]) * (float64(got[j]) - x[j])
			den += x[j] * x[j]
		}
		if e := math.Sqrt(num / den); e > 1e-4 {
			t.Errorf("%v, %d steps, η %v: relative error %.3g against the paper's update", c.sch, c.steps, c.eta, e)
		}
	}
}

// TestDDIMEta1IsDDPM: DDIM with η = 1 has DDPM's posterior mean and
// variance (Song et al. 2021, §4.1), whatever x̂0 and x_t.
func TestDDIMEta1IsDDPM(t *testing.T) {
	s := Cosine(1000)
	pd, _ := NewPlan(s, PlanOptions{Scheduler: DDPM, Steps: 7, Guidance: 1})
	pi, _ := NewPlan(s, PlanOptions{Scheduler: DDIM, Steps: 7, Eta: 1, Guidance: 1})
	r := rand.New(rand.NewPCG(1, 1))
	for i := 1; i < len(pd.Rows); i++ {
		d, m := pd.Rows[i], pi.Rows[i]
		x0, xt := r.NormFloat64(), r.NormFloat64()
		eps := (xt - d[ops.CoefA]*x0) / d[ops.CoefS]
		md := d[ops.CoefX]*xt + d[ops.CoefX0]*x0 + d[ops.CoefEps]*eps
		mi := m[ops.CoefX]*xt + m[ops.CoefX0]*x0 + m[ops.CoefEps]*eps
		if math.Abs(md-mi) > 1e-12 || math.Abs(d[ops.CoefSigma]-m[ops.CoefSigma]) > 1e-12 {
			t.Errorf("step %d: DDPM mean %v σ %v, DDIM(η=1) mean %v σ %v", i, md, d[ops.CoefSigma], mi, m[ops.CoefSigma])
		}
	}
}

// TestGaussianData samples a Gaussian data distribution N(μ, v) with the
// exact noise prediction, ε(x_t) = (x_t − a·E[x0 | x_t])/σ_t with
// E[x0 | x_t] = μ + a·v·(x_t − a·μ)/(a²v + σ_t²), through the fused step:
// the samples' mean and variance must be μ and v up to sampling error and
// the method's discretisation error — DPM-Solver++(2M) within 2% at 20
// steps, and closer than DDIM at the same 20 steps (its point: Lu et al.
// 2022, Fig. 1); DDIM (η = 0 and 1) and DDPM converge at 1000 steps. (With
// few steps DDIM and DDPM's β̃ ("fixedsmall") shrink the variance: 50 DDIM
// steps give 0.235 of 0.25 on the cosine schedule, exactly as DDIM's
// update predicts for Gaussian data.)
func TestGaussianData(t *testing.T) {
	const n, mu, v = 20000, 0.3, 0.25
	s := Cosine(1000)
	moments := func(sch Scheduler, steps int, eta float64) (float64, float64) {
		p, err := NewPlan(s, PlanOptions{Scheduler: sch, Steps: steps, Eta: eta, Guidance: 1, NoClip: true})
		if err != nil {
			t.Fatal(err)
		}
		got := runPlan(t, p, n, 17, func(x []float32, ti, _ int) []float32 {
			ab := s.AlphaBar[ti]
			a, sg := math.Sqrt(ab), math.Sqrt(1-ab)
			out := make([]float32, len(x))
			for i, xv := range x {
				m := mu + a*v*(float64(xv)-a*mu)/(a*a*v+sg*sg)
				out[i] = float32((float64(xv) - a*m) / sg)
			}
			return out
		})
		var m, q float64
		for _, g := range got {
			m += float64(g)
		}
		m /= n
		for _, g := range got {
			q += (float64(g) - m) * (float64(g) - m)
		}
		return m, q / (n - 1)
	}
	// Sampling error: 5 standard errors of the mean and the variance.
	seM, seV := 5*math.Sqrt(v/n), 5*v*math.Sqrt(2.0/n)
	for _, c := range []struct {
		sch   Scheduler
		steps int
		eta   float64
		tol   float64 // relative discretisation error allowed on the variance
	}{{DPMSolverPP, 20, 0, 0.02}, {DDIM, 1000, 0, 0.01}, {DDIM, 1000, 1, 0.01}, {DDPM, 1000, 0, 0.01}} {
		m, q := moments(c.sch, c.steps, c.eta)
		if math.Abs(m-mu) > seM || math.Abs(q-v) > seV+c.tol*v {
			t.Errorf("%v %d steps η %v: mean %.4f (want %v), variance %.4f (want %v)", c.sch, c.steps, c.eta, m, mu, q, v)
		} else {
			t.Logf("%v %d steps η %v: mean %.4f, variance %.4f", c.sch, c.steps, c.eta, m, q)
		}
	}
	// The same noise through both: the difference is discretisation only.
	_, qd := moments(DPMSolverPP, 20, 0)
	_, qi := moments(DDIM, 20, 0)
	if !(math.Abs(qd-v) < math.Abs(qi-v)/4) {
		t.Errorf("20 steps: DPM-Solver++ variance %.4f, DDIM %.4f (want DPM-Solver++ much closer to %v)", qd, qi, v)
	}
}

func TestPlanValidation(t *testing.T) {
	s := Linear(100)
	for _, o := range []PlanOptions{
		{Scheduler: DDIM, Steps: 0},
		{Scheduler: DDIM, Steps: 101},
		{Scheduler: DDIM, Steps: 10, Eta: -1},
		{Scheduler: DDIM, Steps: 10, Strength: 1.5},
		{Scheduler: DDIM, Steps: 10, Blend: 1},
		{Scheduler: Scheduler(7), Steps: 10},
		{Scheduler: DDIM, Steps: 60, Strength: 0.5}, // 60 steps from timestep 50
	} {
		if _, err := NewPlan(s, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if _, err := ParseScheduler("euler"); err == nil {
		t.Error("an unknown scheduler was accepted")
	}
	if k, err := ParseScheduler("DPMSolver++"); err != nil || k != DPMSolverPP {
		t.Errorf("ParseScheduler(DPMSolver++) = %v, %v", k, err)
	}
}
