package diffusion

import (
	"math"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func tinySampler(t *testing.T, n int, guidance bool) (*Sampler, *nn.UNet) {
	t.Helper()
	h := device.NewHost()
	a := device.Local{Dev: h}
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := nn.UNetConfig{Channels: []int{8, 16}, InChannels: 1, Size: 8, Classes: 3, Groups: 4, Heads: 2}
	m, err := nn.NewUNet(a, "", cfg, nn.UNetOptions{}, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Free() })
	// Non-zero output layers, so the images depend on the model.
	flat, _ := m.Flat().ReadF32()
	for _, p := range m.Layout() {
		for i := 0; i < p.Numel(); i++ {
			if flat[p.Offset+i] == 0 {
				flat[p.Offset+i] = 0.05 * float32((i*7919+p.Offset)%13-6)
			}
		}
	}
	if err := m.Flat().WriteF32(flat); err != nil {
		t.Fatal(err)
	}
	s, err := NewSampler(e, a, m, SamplerOptions{N: n, Guidance: guidance, Seed: 3, Graph: true, MaxSteps: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Free() })
	return s, m
}

func images(t *testing.T, s *Sampler) []float32 {
	v, err := s.Images().ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), v...)
}

func same(a, b []float32) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSamplerDeterminism: DDIM with η = 0 and DPM-Solver++ are
// deterministic given the start noise — the same seed and run index give
// the same images, bit for bit; another run index draws another start.
func TestSamplerDeterminism(t *testing.T) {
	s, _ := tinySampler(t, 3, true)
	for _, sch := range []Scheduler{DDIM, DPMSolverPP, DDPM} {
		p, err := NewPlan(Linear(1000), PlanOptions{Scheduler: sch, Steps: 5, Guidance: 2})
		if err != nil {
			t.Fatal(err)
		}
		run := func(r int) []float32 {
			if _, err := s.Run(p, RunOptions{Labels: []int32{0, 1, 2}, Run: r}); err != nil {
				t.Fatal(err)
			}
			return images(t, s)
		}
		a, b, c := run(0), run(0), run(1)
		if !same(a, b) {
			t.Errorf("%v: two runs with the same seed and index differ", sch)
		}
		if same(a, c) {
			t.Errorf("%v: runs 0 and 1 gave the same images", sch)
		}
		for _, v := range a {
			if !(v >= -1 && v <= 1) {
				t.Fatalf("%v: pixel %v outside [-1, 1] with clipping", sch, v)
			}
		}
	}
}

// TestSamplerGuidanceAndLabels: with guidance scale 1 the unconditional
// pass has no weight, so a guided sampler gives the conditional-only
// sampler's images; the labels change the images.
func TestSamplerGuidanceAndLabels(t *testing.T) {
	g, _ := tinySampler(t, 2, true)
	c, _ := tinySampler(t, 2, false)
	p1, _ := NewPlan(Linear(1000), PlanOptions{Scheduler: DDIM, Steps: 4, Guidance: 1})
	if _, err := g.Run(p1, RunOptions{Labels: []int32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(p1, RunOptions{Labels: []int32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	a, b := images(t, g), images(t, c)
	var d float64
	for i := range a {
		d = max(d, float64(a[i]-b[i]), float64(b[i]-a[i]))
	}
	if d > 1e-5 {
		t.Errorf("guidance 1 differs from conditional sampling by %v", d)
	}
	if _, err := c.Run(p1, RunOptions{Labels: []int32{0, 3}}); err != nil { // 3: the null class
		t.Fatal(err)
	}
	if same(b, images(t, c)) {
		t.Error("other labels gave the same images")
	}
	if _, err := c.Run(p1, RunOptions{Labels: []int32{0, 4}}); err == nil {
		t.Error("label 4 of 3 classes accepted")
	}
}

// TestSamplerVideo: a frame re-noised to strength 1 (pure noise) and
// blended by 0 does not depend on the previous frame; at a small strength
// and a large blend it stays close to it.
func TestSamplerVideo(t *testing.T) {
	s, _ := tinySampler(t, 1, true)
	first, _ := NewPlan(Linear(1000), PlanOptions{Scheduler: DDIM, Steps: 4, Guidance: 2})
	if _, err := s.Run(first, RunOptions{Labels: []int32{0}}); err != nil {
		t.Fatal(err)
	}
	f0 := images(t, s)
	if err := s.SetPrevious(); err != nil {
		t.Fatal(err)
	}
	near, _ := NewPlan(Linear(1000), PlanOptions{Scheduler: DDIM, Steps: 2, Guidance: 2, Strength: 0.1, Blend: 0.9})
	var dist float64
	for f := 1; f <= 3; f++ {
		if _, err := s.Run(near, RunOptions{Labels: []int32{1}, Run: f, Video: true}); err != nil {
			t.Fatal(err)
		}
		cur := images(t, s)
		for i := range cur {
			dist = max(dist, float64(cur[i]-f0[i]), float64(f0[i]-cur[i]))
		}
		f0 = cur
	}
	if dist > 0.5 {
		t.Errorf("frames at strength 0.1, blend 0.9 moved by up to %v", dist)
	}
	if s.Images().DType != tensor.F32 {
		t.Error("images not f32")
	}
}

// TestSamplerResidualGuidance: R-CFG (PlanOptions.Residual) on a guided
// sampler. With one final DPM-Solver++ step and no clipping a frame is
// x̂0 blended with the previous frame, and R-CFG's x̂0 is prev +
// g·(x̂0_c − prev), so (frame − prev) at scale g is g times (frame −
// prev) at scale 1 (conditional only) from the same noise; and a
// residual plan is refused outside a video run and by a guided sampler
// made without Residual.
func TestSamplerResidualGuidance(t *testing.T) {
	_, m := tinySampler(t, 2, false) // a model with non-zero output layers
	h := device.NewHost()
	a := device.Local{Dev: h}
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := NewPlan(Linear(1000), PlanOptions{Scheduler: DDIM, Steps: 3, Guidance: 2})
	frame := func(g float64) (prev, cur []float32) {
		s, err := NewSampler(e, a, m, SamplerOptions{N: 2, Guidance: true, Residual: true, Seed: 3, MaxSteps: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Free()
		if _, err := s.Run(first, RunOptions{Labels: []int32{0, 1}}); err != nil {
			t.Fatal(err)
		}
		prev = images(t, s)
		if err := s.SetPrevious(); err != nil {
			t.Fatal(err)
		}
		next, err := NewPlan(Linear(1000), PlanOptions{Scheduler: DPMSolverPP, Steps: 1, Guidance: g, Strength: 0.5, Blend: 0.25,
			NoClip: true, Residual: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Run(next, RunOptions{Labels: []int32{1, 2}, Run: 1, Video: true}); err != nil {
			t.Fatal(err)
		}
		return prev, images(t, s)
	}
	const g = 2.5
	prev, c1 := frame(1)
	prev2, cg := frame(g)
	if !same(prev, prev2) {
		t.Fatal("the first frames differ")
	}
	var moved float64
	for i := range prev {
		d1, dg := float64(c1[i]-prev[i]), float64(cg[i]-prev[i])
		moved = max(moved, math.Abs(d1))
		if math.Abs(dg-g*d1) > 1e-4*(1+math.Abs(dg)) {
			t.Fatalf("element %d: frame − prev is %v at scale %v, %v at scale 1 (want %v times it)", i, dg, g, d1, g)
		}
	}
	if moved < 1e-3 {
		t.Fatalf("the frame did not move from the previous one (%v): the check is vacuous", moved)
	}

	s, err := NewSampler(e, a, m, SamplerOptions{N: 2, Guidance: true, Seed: 3, MaxSteps: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Free()
	res, _ := NewPlan(Linear(1000), PlanOptions{Scheduler: DDIM, Steps: 2, Guidance: 2, Strength: 0.5, Residual: true})
	if _, err := s.Run(res, RunOptions{Labels: []int32{0, 1}, Run: 1, Video: true}); err == nil {
		t.Error("a guided sampler without Residual ran a residual plan")
	}
	r, err := NewSampler(e, a, m, SamplerOptions{N: 2, Guidance: true, Residual: true, Seed: 3, MaxSteps: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Free()
	if _, err := r.Run(res, RunOptions{Labels: []int32{0, 1}, Run: 1}); err == nil {
		t.Error("a residual plan ran without a previous frame")
	}
	if _, err := r.Run(res, RunOptions{Labels: []int32{0, 1}, Run: 1, Video: true}); err != nil {
		t.Errorf("a video run of a residual plan: %v", err)
	}
}

// TestSamplerCastWeightsOnce: in bf16, a sampler that copies the GEMM and
// convolution weights to bf16 once (Weights nil: nn.UNet.CastParams) draws
// the images of one that casts the f32 masters in every evaluation (the
// same rounding).
func TestSamplerCastWeightsOnce(t *testing.T) {
	h := device.NewHost()
	a := device.Local{Dev: h}
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, m := tinySampler(t, 1, false) // a model with non-zero output layers
	p, _ := NewPlan(Linear(1000), PlanOptions{Scheduler: DPMSolverPP, Steps: 3, Guidance: 2})
	draw := func(w []nn.Param) []float32 {
		s, err := NewSampler(e, a, m, SamplerOptions{N: 2, Guidance: true, Autocast: tensor.BF16, Seed: 2, Weights: w, MaxSteps: 3})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Free()
		if _, err := s.Run(p, RunOptions{Labels: []int32{1, 2}}); err != nil {
			t.Fatal(err)
		}
		return images(t, s)
	}
	once, each := draw(nil), draw(m.Params())
	if !same(once, each) {
		t.Error("bf16 weights copied once give other images than casting in every evaluation")
	}
}

// TestSamplerOnStep: on the host, OnStep is called once per step of each
// run (the first, eager one and the later, replayed ones), and a run
// without it calls nothing left over from an earlier run.
func TestSamplerOnStep(t *testing.T) {
	s, _ := tinySampler(t, 2, true)
	calls := 0
	for _, steps := range []int{3, 7} {
		p, err := NewPlan(Linear(1000), PlanOptions{Scheduler: DPMSolverPP, Steps: steps, Guidance: 2})
		if err != nil {
			t.Fatal(err)
		}
		for run := range 2 {
			before := calls
			if _, err := s.Run(p, RunOptions{Labels: []int32{0, 1}, Run: run, OnStep: func() { calls++ }}); err != nil {
				t.Fatal(err)
			}
			if calls-before != steps {
				t.Errorf("%d-step plan, run %d: OnStep called %d times", steps, run, calls-before)
			}
		}
		before := calls
		if _, err := s.Run(p, RunOptions{Labels: []int32{0, 1}, Run: 5}); err != nil || calls != before {
			t.Fatalf("run without OnStep: %v, an earlier run's OnStep called %d times", err, calls-before)
		}
	}
}
