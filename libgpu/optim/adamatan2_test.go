package optim_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
)

// TestAdamATan2StepMatchesReference checks the wiring: the package's state
// names, zero-initialised; every param updated from its own gradient and
// moments as opstest's float64 reference of the package's formula, with
// HRM's betas and weight decay; the step counter; a learning-rate scale
// read from the device; Reset.
func TestAdamATan2StepMatchesReference(t *testing.T) {
	shapes := [][]int{{6, 4}, {6}, {3, 5}}
	p := hostProblem(t, shapes...)
	r := rand.New(rand.NewPCG(5, 6))
	p.set(draws(r, 1, shapes))
	cfg := ops.AdamATan2Config{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, WeightDecay: 1}
	o, err := optim.NewAdamATan2(p.a, "run", p.params, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	var want []string
	for _, n := range p.names() {
		want = append(want, n+".exp_avg", n+".exp_avg_sq")
	}
	want = append(want, "step")
	var got []string
	for _, s := range o.State() {
		got = append(got, s.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("state %v, want %v", got, want)
	}
	scale := opstest.Upload(t, p.a, []float32{1}, 1)
	o.SetLRScale(scale)
	pf := p.values()
	mf, vf := make([][]float64, len(pf)), make([][]float64, len(pf))
	for i := range pf {
		mf[i], vf[i] = make([]float64, len(pf[i])), make([]float64, len(pf[i]))
	}
	for step := 1; step <= 4; step++ {
		sc := float32(step) / 4
		if err := scale.WriteF32([]float32{sc}); err != nil {
			t.Fatal(err)
		}
		gs := roundF32(draws(r, 1, shapes))
		p.grads(gs)
		for i := range pf {
			opstest.AdamATan2Ref(pf[i], gs[i], mf[i], vf[i], step, float64(cfg.LR*sc), float64(cfg.WeightDecay), cfg)
		}
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
		if e := relErr(p.values(), pf); e > 1e-6 {
			t.Fatalf("step %d: relative error %.3g", step, e)
		}
	}
	if got := opstest.DownloadI32(t, o.Counter())[0]; got != 4 {
		t.Fatalf("step counter %d, want 4", got)
	}
	if err := o.Reset(p.e); err != nil {
		t.Fatal(err)
	}
	if got := opstest.DownloadI32(t, o.Counter())[0]; got != 0 {
		t.Fatalf("after Reset: step counter %d", got)
	}
}

// TestAdamATan2Resume: stopped and resumed from its state at any step, a
// run continues bitwise.
func TestAdamATan2Resume(t *testing.T) {
	checkResume(t, [][]int{{5, 4}, {4}}, 5, func(t testing.TB, p *problem) optim.Optimizer {
		o, err := optim.NewAdamATan2(p.a, "run", p.params, ops.AdamATan2Config{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, WeightDecay: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		return o
	})
}

// TestSignSGDStep: HRM's puzzle-embedding update on a one-row table (the
// Sudoku case): p ← p(1 − lr·wd) − lr·sign(g), zero gradients giving the
// decay alone; no state.
func TestSignSGDStep(t *testing.T) {
	p := hostProblem(t, []int{1, 8})
	r := rand.New(rand.NewPCG(3, 4))
	p.set(draws(r, 1, p.shapes))
	o, err := optim.NewSignSGD(p.params, ops.SignSGDConfig{LR: 1e-2, WeightDecay: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.State()) != 0 {
		t.Fatalf("sign-SGD has state %v", o.State())
	}
	want := p.values()
	g := roundF32(draws(r, 1, p.shapes))
	g[0][2], g[0][5] = 0, 0
	p.grads(g)
	opstest.SignSGDRef(want[0], g[0], 1e-2, 0.1)
	if err := o.Step(p.e); err != nil {
		t.Fatal(err)
	}
	if e := relErr(p.values(), want); e > 1e-7 {
		t.Fatalf("relative error %.3g", e)
	}
	if _, err := optim.NewSignSGD(nil, ops.SignSGDConfig{}); err == nil {
		t.Fatal("sign-SGD over no parameters accepted")
	}
}
