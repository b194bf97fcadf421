package diffusion

// GPU tests and benchmarks of the sampling loop: graph == eager, the GPU
// against the host backend, and the timings of bench/unet.sh (one guided
// step at batch 256, images/s of 20-step DPM-Solver++, batch-1 video
// frames).

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func gpuDevice(t testing.TB) *device.CUDA {
	t.Helper()
	cudatest.RequireGPU(t)
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func engineOn(t testing.TB, d device.Device, prec ops.Precision) *ops.Engine {
	t.Helper()
	e, err := ops.NewEngine(d, ops.Options{Precision: prec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close()
	})
	return e
}

// randomWeights are flat weights of cfg's layout as a trained model might
// have them: NewUNet's initialisation with the zero-initialised layers
// (which would make every prediction 0) drawn small instead.
func randomWeights(t testing.TB, cfg nn.UNetConfig, seed uint64) []float32 {
	m, err := nn.NewUNet(device.Local{Dev: device.NewHost()}, "", cfg, nn.UNetOptions{}, seed)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	flat, err := m.Flat().ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	flat = append([]float32(nil), flat...)
	r := rand.New(rand.NewPCG(seed, 9))
	for _, p := range m.Layout() {
		zero := true
		for _, v := range flat[p.Offset : p.Offset+p.Numel()] {
			zero = zero && v == 0
		}
		if zero && !strings.HasSuffix(p.Name, "norm.bias") && !strings.HasSuffix(p.Name, "norm1.bias") && !strings.HasSuffix(p.Name, "norm2.bias") {
			for i := 0; i < p.Numel(); i++ {
				flat[p.Offset+i] = float32(0.02 * r.NormFloat64())
			}
		}
	}
	return flat
}

// unetOn puts flat weights on a's device as a U-Net.
func unetOn(t testing.TB, a device.Allocator, cfg nn.UNetConfig, flat []float32) *nn.UNet {
	w, err := tensor.Alloc(a, "", tensor.F32, len(flat))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Buf.Free() })
	if err := w.WriteF32(flat); err != nil {
		t.Fatal(err)
	}
	m, err := nn.UNetOn(cfg, w)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func relErr(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if math.IsNaN(num) {
		return math.Inf(1)
	}
	return math.Sqrt(num / max(den, 1e-30))
}

func readImages(t testing.TB, s *Sampler) []float32 {
	v, err := s.Images().ReadF32()
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), v...)
}

// TestCUDASamplerGraphEqualsEager: the sampling loop replayed as one CUDA
// graph gives the images of the same loop launched op by op (the default
// U-Net, bf16, guided, DPM-Solver++): runs 0 and 1 of a graph sampler
// (the first of each length eager, later ones replays) against an eager
// sampler's, and a replay of run 0 against its first, eager, run.
func TestCUDASamplerGraphEqualsEager(t *testing.T) {
	d := gpuDevice(t)
	a := device.Local{Dev: d}
	cfg := nn.DefaultUNet()
	m := unetOn(t, a, cfg, randomWeights(t, cfg, 1))
	p, err := NewPlan(Linear(1000), PlanOptions{Scheduler: DPMSolverPP, Steps: 8, Guidance: 3})
	if err != nil {
		t.Fatal(err)
	}
	labels := []int32{0, 3, 7, 10}
	run := func(graph bool) [][]float32 {
		e := engineOn(t, d, ops.PrecBF16)
		s, err := NewSampler(e, a, m, SamplerOptions{N: 4, Guidance: true, Autocast: tensor.BF16, Graph: graph, Seed: 5, Prefix: "g", MaxSteps: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Free()
		var out [][]float32
		for _, r := range []int{0, 0, 1} {
			if _, err := s.Run(p, RunOptions{Labels: labels, Run: r}); err != nil {
				t.Fatal(err)
			}
			out = append(out, readImages(t, s))
		}
		return out
	}
	eager, graph := run(false), run(true)
	for i, what := range []string{"run 0 (eager in both)", "run 0 (graph replay)", "run 1 (graph replay)"} {
		if e := relErr(graph[i], eager[i]); e > 1e-6 {
			t.Errorf("%s: graph vs eager relative difference %.3g", what, e)
		}
	}
	if e := relErr(graph[1], graph[0]); e > 1e-6 {
		t.Errorf("the replay of run 0 differs from its eager run by %.3g", e)
	}
	if relErr(eager[2], eager[0]) < 1e-3 {
		t.Error("runs 0 and 1 gave the same images")
	}
}

// TestCUDAUNetMatchesHost: the U-Net's forward on the GPU against the host
// backend with the same weights and inputs: in f32 (PrecF32: f32 GEMMs),
// and under bf16 autocast within bf16's error.
func TestCUDAUNetMatchesHost(t *testing.T) {
	d := gpuDevice(t)
	cfg := nn.DefaultUNet()
	flat := randomWeights(t, cfg, 2)
	const B = 3
	r := rand.New(rand.NewPCG(3, 3))
	x := make([]float32, B*32*32)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	ts, ys := []int32{999, 500, 3}, []int32{1, 10, 4}
	forward := func(dev device.Device, prec ops.Precision, cast tensor.DType) []float32 {
		a := device.Local{Dev: dev}
		e := engineOn(t, dev, prec)
		m := unetOn(t, a, cfg, flat)
		ev, err := m.RecordEval(e, a, "", B, ops.GraphOptions{Autocast: cast}, m.Params())
		if err != nil {
			t.Fatal(err)
		}
		defer ev.Free()
		if err := ev.X.WriteFloat32(x); err != nil {
			t.Fatal(err)
		}
		if err := ev.T.Write(tensor.AsBytes(ts)); err != nil {
			t.Fatal(err)
		}
		if err := ev.Y.Write(tensor.AsBytes(ys)); err != nil {
			t.Fatal(err)
		}
		if err := e.Do(ev.Graph.Forward); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		v, err := ev.Eps.Value.ReadFloat32()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	host := forward(device.NewHost(), ops.PrecF32, tensor.F32)
	if e := relErr(forward(d, ops.PrecF32, tensor.F32), host); e > 1e-4 {
		t.Errorf("f32: GPU vs host relative error %.3g", e)
	}
	if e := relErr(forward(d, ops.PrecBF16, tensor.BF16), host); e > 3e-2 {
		t.Errorf("bf16: GPU vs host relative error %.3g", e)
	}
}

// TestCUDASamplerMatchesHost: a whole guided sampling run (a small U-Net,
// DDIM and DDPM, f32) on the GPU against the host backend: the same noise
// (Philox, f32 there and float64 here) and the same updates.
func TestCUDASamplerMatchesHost(t *testing.T) {
	d := gpuDevice(t)
	cfg := nn.UNetConfig{Channels: []int{32, 64, 64}, InChannels: 1, Size: 32, Classes: 10, Groups: 8, Heads: 2}
	flat := randomWeights(t, cfg, 4)
	for _, sch := range []Scheduler{DDIM, DDPM} {
		p, err := NewPlan(Cosine(1000), PlanOptions{Scheduler: sch, Steps: 6, Guidance: 2})
		if err != nil {
			t.Fatal(err)
		}
		sample := func(dev device.Device) []float32 {
			a := device.Local{Dev: dev}
			e := engineOn(t, dev, ops.PrecF32)
			s, err := NewSampler(e, a, unetOn(t, a, cfg, flat), SamplerOptions{N: 2, Guidance: true, Graph: true, Seed: 8, MaxSteps: 6})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Free()
			if _, err := s.Run(p, RunOptions{Labels: []int32{2, 9}, Run: 4}); err != nil {
				t.Fatal(err)
			}
			return readImages(t, s)
		}
		if e := relErr(sample(d), sample(device.NewHost())); e > 1e-3 {
			t.Errorf("%v: GPU vs host relative error %.3g", sch, e)
		}
	}
}

// TestCUDASamplerResidualMatchesHost: a video with residual guidance
// (R-CFG) on a guided sampler — its first frame with two passes, the later
// frames on the batch-N model — on the GPU (f32; frame 2 a replay of the
// captured loop) against the host backend.
func TestCUDASamplerResidualMatchesHost(t *testing.T) {
	d := gpuDevice(t)
	cfg := nn.UNetConfig{Channels: []int{32, 64, 64}, InChannels: 1, Size: 32, Classes: 10, Groups: 8, Heads: 2}
	flat := randomWeights(t, cfg, 6)
	first, err := NewPlan(Cosine(1000), PlanOptions{Scheduler: DDIM, Steps: 3, Guidance: 2})
	if err != nil {
		t.Fatal(err)
	}
	next, err := NewPlan(Cosine(1000), PlanOptions{Scheduler: DPMSolverPP, Steps: 3, Guidance: 1.5, Strength: 0.5, Blend: 0.2, Residual: true})
	if err != nil {
		t.Fatal(err)
	}
	video := func(dev device.Device) [][]float32 {
		a := device.Local{Dev: dev}
		e := engineOn(t, dev, ops.PrecF32)
		s, err := NewSampler(e, a, unetOn(t, a, cfg, flat), SamplerOptions{N: 2, Guidance: true, Residual: true, Graph: true, Seed: 8, MaxSteps: 3})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Free()
		if _, err := s.Run(first, RunOptions{Labels: []int32{2, 9}}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetPrevious(); err != nil {
			t.Fatal(err)
		}
		var out [][]float32
		for f := 1; f <= 2; f++ {
			if _, err := s.Run(next, RunOptions{Labels: []int32{3, 9}, Run: f, Video: true}); err != nil {
				t.Fatal(err)
			}
			out = append(out, readImages(t, s))
		}
		return out
	}
	gpu, host := video(d), video(device.NewHost())
	for f := range gpu {
		if e := relErr(gpu[f], host[f]); e > 1e-3 {
			t.Errorf("frame %d: GPU vs host relative error %.3g", f+1, e)
		}
	}
}

// benchSampler times runs of plan on the default U-Net in bf16 with the
// loop captured as one graph: the mean GPU milliseconds of a run.
func benchSampler(b *testing.B, n int, plan *Plan, video bool) float64 {
	d := gpuDevice(b)
	a := device.Local{Dev: d}
	cfg := nn.DefaultUNet()
	m := unetOn(b, a, cfg, randomWeights(b, cfg, 1))
	e := engineOn(b, d, ops.PrecBF16)
	s, err := NewSampler(e, a, m, SamplerOptions{N: n, Guidance: true, Residual: plan.Options.Residual, Autocast: tensor.BF16, Graph: true,
		Seed: 1, MaxSteps: len(plan.Rows) - 1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Free()
	labels := make([]int32, n)
	for i := range labels {
		labels[i] = int32(i % 10)
	}
	// Warm up: the eager first run, then the capture and a first replay.
	for r := 0; r < 2; r++ {
		if _, err := s.Run(plan, RunOptions{Labels: labels, Run: r, Video: video}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var total float64
	for i := 0; i < b.N; i++ {
		ms, err := s.Run(plan, RunOptions{Labels: labels, Run: i + 2, Video: video})
		if err != nil {
			b.Fatal(err)
		}
		total += float64(ms)
	}
	b.StopTimer()
	return total / float64(b.N)
}

// BenchmarkGuidedStep256 is one guided DPM-Solver++ step at batch 256
// (512 images through the U-Net, bf16): a 20-step loop captured as one
// graph, its GPU time divided by 20, and the loop's images per second.
func BenchmarkGuidedStep256(b *testing.B) {
	p, err := NewPlan(Linear(1000), PlanOptions{Scheduler: DPMSolverPP, Steps: 20, Guidance: 3})
	if err != nil {
		b.Fatal(err)
	}
	ms := benchSampler(b, 256, p, false)
	b.ReportMetric(ms/20, "ms/step")
	b.ReportMetric(256/(ms/1000), "images/s")
}

// BenchmarkVideoFrame is one batch-1 video frame: re-noising to strength
// 0.5, 4 guided DPM-Solver++ steps with temporal blending, as one graph
// launch; GPU milliseconds per frame.
func BenchmarkVideoFrame(b *testing.B) {
	p, err := NewPlan(Linear(1000), PlanOptions{Scheduler: DPMSolverPP, Steps: 4, Guidance: 3, Strength: 0.5, Blend: 0.2})
	if err != nil {
		b.Fatal(err)
	}
	ms := benchSampler(b, 1, p, true)
	b.ReportMetric(ms, "ms/frame")
}

// BenchmarkVideoFrameResidual is BenchmarkVideoFrame guided by R-CFG at
// scale 1.5 (PlanOptions.Residual): one U-Net pass of one image a step
// instead of two.
func BenchmarkVideoFrameResidual(b *testing.B) {
	p, err := NewPlan(Linear(1000), PlanOptions{Scheduler: DPMSolverPP, Steps: 4, Guidance: 1.5, Strength: 0.5, Blend: 0.2, Residual: true})
	if err != nil {
		b.Fatal(err)
	}
	ms := benchSampler(b, 1, p, true)
	b.ReportMetric(ms, "ms/frame")
}
