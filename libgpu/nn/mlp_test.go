package nn_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/autograd"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

func setup(t *testing.T, cfg nn.MLPConfig) (*nn.MLP, *ops.Engine, *opstest.PoisonAlloc) {
	t.Helper()
	h := device.NewHost()
	a := &opstest.PoisonAlloc{Dev: h}
	m, err := nn.NewMLP(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Free(); err != nil {
			t.Error(err)
		}
	})
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m, e, a
}

func readParams(t *testing.T, m *nn.MLP) [][]float64 {
	var out [][]float64
	for _, p := range m.Params() {
		out = append(out, opstest.Download(t, p.Value))
	}
	return out
}

func TestInitDeterministic(t *testing.T) {
	cfg := nn.MLPConfig{Widths: []int{7, 300, 5}, Act: ops.ActReLU, Batch: 2, Seed: 42}
	m1, _, _ := setup(t, cfg)
	m2, _, _ := setup(t, cfg)
	cfg.Seed = 43
	m3, _, _ := setup(t, cfg)
	p1, p2, p3 := readParams(t, m1), readParams(t, m2), readParams(t, m3)
	for i := range p1 {
		if !slices.Equal(p1[i], p2[i]) {
			t.Fatalf("same seed, %s differs", m1.Params()[i].Name)
		}
		if slices.Equal(p1[i], p3[i]) {
			t.Fatalf("different seed, %s equal", m1.Params()[i].Name)
		}
	}
	// U(−1/√fan_in, 1/√fan_in): within the bound, mean ≈ 0, variance ≈ bound²/3.
	for i, p := range m1.Params() {
		fanIn := cfg.Widths[i/2]
		bound := 1 / math.Sqrt(float64(fanIn))
		var sum, sq float64
		for _, v := range p1[i] {
			if math.Abs(v) > bound {
				t.Fatalf("%s: |%v| > 1/√%d", p.Name, v, fanIn)
			}
			sum += v
			sq += v * v
		}
		n := float64(len(p1[i]))
		if n < 1000 {
			continue
		}
		mean, variance := sum/n, sq/n
		if math.Abs(mean) > 4*bound/math.Sqrt(3*n) || math.Abs(variance/(bound*bound/3)-1) > 0.1 {
			t.Errorf("%s: mean %v, variance %v, want 0 and %v", p.Name, mean, variance, bound*bound/3)
		}
	}
}

func TestNamesAndShapes(t *testing.T) {
	m, _, a := setup(t, nn.MLPConfig{Widths: []int{4, 6, 3}, Act: ops.ActGELU, Batch: 5, Seed: 1, Prefix: "run1"})
	for _, want := range []string{"run1/params/fc0.weight", "run1/params/fc1.bias", "run1/grads/fc0.weight",
		"run1/grads/fc1.bias", "run1/acts/input", "run1/acts/labels", "run1/acts/loss", "run1/acts/fc0.pre"} {
		if !slices.Contains(a.Names, want) {
			t.Errorf("no buffer named %q in %v", want, a.Names)
		}
	}
	// ReLU keeps its bit-mask for the chained backward instead of z.
	_, _, ra := setup(t, nn.MLPConfig{Widths: []int{4, 6, 3}, Act: ops.ActReLU, Batch: 5, Seed: 1})
	if !slices.Contains(ra.Names, "acts/fc0.mask") || slices.Contains(ra.Names, "acts/fc0.pre") {
		t.Errorf("ReLU buffers %v: want acts/fc0.mask and no acts/fc0.pre", ra.Names)
	}
	var got []string
	for _, p := range m.Params() {
		got = append(got, fmt.Sprintf("%s%v%v", p.Name, p.Value.Shape, p.Grad.Shape))
	}
	want := []string{"fc0.weight[6 4][6 4]", "fc0.bias[6][6]", "fc1.weight[3 6][3 6]", "fc1.bias[3][3]"}
	if !slices.Equal(got, want) {
		t.Fatalf("params %v, want %v", got, want)
	}
	checks := []struct {
		t  *tensor.Tensor
		dt tensor.DType
		sh []int
	}{{m.Input(), tensor.F32, []int{5, 4}}, {m.Labels(), tensor.I32, []int{5}}, {m.Logits(), tensor.F32, []int{5, 3}}, {m.Loss(), tensor.F32, []int{1}}}
	for _, c := range checks {
		if err := c.t.CheckShape("tensor", c.dt, c.sh...); err != nil {
			t.Error(err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	a := device.Local{Dev: device.NewHost()}
	for _, cfg := range []nn.MLPConfig{
		{Widths: []int{4}, Batch: 1},
		{Widths: []int{4, 0, 2}, Batch: 1},
		{Widths: []int{4, 2}, Batch: 0},
		{Widths: []int{4, 2}, Batch: 1, Act: ops.Act(7)},
	} {
		if _, err := nn.NewMLP(a, cfg); !errors.Is(err, nn.ErrConfig) {
			t.Errorf("%+v: error %v, want ErrConfig", cfg, err)
		}
	}
}

// refLoss is the MLP's loss in float64, from opstest's references.
func refLoss(widths []int, act ops.Act, params [][]float64, x []float64, labels []int32, batch int) (loss float64, logits []float64) {
	h := x
	L := len(widths) - 1
	for i := 0; i < L; i++ {
		a := act
		if i == L-1 {
			a = ops.ActNone
		}
		h, _ = opstest.LinearRef(h, params[2*i], params[2*i+1], batch, widths[i], widths[i+1], a)
	}
	loss, _ = opstest.SoftmaxCrossEntropyRef(h, labels, batch, widths[L])
	return loss, h
}

func writeBatch(t *testing.T, m *nn.MLP, r *rand.Rand, widths []int, batch int) ([]float64, []int32) {
	x := opstest.Rand(r, batch*widths[0])
	for i := range x {
		x[i] *= 2
	}
	labels := make([]int32, batch)
	for i := range labels {
		labels[i] = int32(r.IntN(widths[len(widths)-1]))
	}
	if err := m.Input().WriteF32(x); err != nil {
		t.Fatal(err)
	}
	if err := m.Labels().Write(tensor.AsBytes(labels)); err != nil {
		t.Fatal(err)
	}
	return opstest.F64(x), labels
}

// TestGradFiniteDifferences compares Backward with central differences of
// the float64 reference loss with respect to every parameter.
func TestGradFiniteDifferences(t *testing.T) {
	widths := []int{3, 5, 4, 3}
	const batch = 4
	for _, act := range []ops.Act{ops.ActNone, ops.ActReLU, ops.ActGELU} {
		t.Run(act.String(), func(t *testing.T) {
			m, e, _ := setup(t, nn.MLPConfig{Widths: widths, Act: act, Batch: batch, Seed: 7})
			r := rand.New(rand.NewPCG(uint64(act), 99))
			x, labels := writeBatch(t, m, r, widths, batch)
			if err := m.Forward(e); err != nil {
				t.Fatal(err)
			}
			if err := m.Backward(e); err != nil {
				t.Fatal(err)
			}
			params := readParams(t, m)
			wantLoss, wantLogits := refLoss(widths, act, params, x, labels, batch)
			if err := opstest.TermsErr(opstest.Download(t, m.Loss()), []float64{wantLoss}, nil); err > 1e-5 {
				t.Errorf("loss relative error %v", err)
			}
			if err := opstest.TermsErr(opstest.Download(t, m.Logits()), wantLogits, nil); err > 1e-5 {
				t.Errorf("logits relative error %v", err)
			}
			for i, p := range m.Params() {
				fd := opstest.FiniteDiff(func([]float64) float64 {
					l, _ := refLoss(widths, act, params, x, labels, batch)
					return l
				}, params[i], 1e-6)
				if err := opstest.TermsErr(opstest.Download(t, p.Grad), fd, nil); err > 1e-4 {
					t.Errorf("%s: gradient relative error %v vs finite differences", p.Name, err)
				}
			}
		})
	}
}

func TestPredictAndStaticBuffers(t *testing.T) {
	widths := []int{6, 8, 5}
	m, e, a := setup(t, nn.MLPConfig{Widths: widths, Act: ops.ActReLU, Batch: 9, Seed: 3})
	nalloc := len(a.Names)
	if err := m.Backward(e); !errors.Is(err, autograd.ErrNoForward) {
		t.Fatalf("Backward before Forward: %v", err)
	}
	r := rand.New(rand.NewPCG(5, 5))
	out := opstest.Empty(t, device.Local{Dev: e.Device()}, tensor.I32, 9)
	for step := 0; step < 3; step++ {
		writeBatch(t, m, r, widths, 9)
		if err := m.Forward(e); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(e); err != nil {
			t.Fatal(err)
		}
		if err := m.Predict(e, out); err != nil {
			t.Fatal(err)
		}
		logits, err := m.Logits().ReadF32()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := opstest.DownloadI32(t, out), opstest.ArgmaxRef(logits, 9, 5); !slices.Equal(got, want) {
			t.Fatalf("Predict %v, want %v", got, want)
		}
	}
	if len(a.Names) != nalloc {
		t.Fatalf("steps allocated %d buffers", len(a.Names)-nalloc)
	}
}

// TestChainMatchesPerLayer: the chained backward (one LinearBackwardChain
// per layer, ReLU through its bit-mask) gives the gradients of the
// per-layer LinearBackward path (an engine with Options.NoLinearChain),
// on the same weights and batch.
func TestChainMatchesPerLayer(t *testing.T) {
	widths := []int{9, 17, 130, 6, 4}
	const batch = 11
	for _, act := range []ops.Act{ops.ActNone, ops.ActReLU, ops.ActGELU} {
		t.Run(act.String(), func(t *testing.T) {
			cfg := nn.MLPConfig{Widths: widths, Act: act, Batch: batch, Seed: 5}
			chained, e, _ := setup(t, cfg)
			if !e.HasLinearChain() {
				t.Fatal("the host backend has no LinearBackwardChain")
			}
			// An engine told to take the per-layer path (Options.NoLinearChain).
			pd := device.NewHost()
			plain, err := nn.NewMLP(device.Local{Dev: pd}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Free()
			pe, err := ops.NewEngine(pd, ops.Options{NoLinearChain: true})
			if err != nil {
				t.Fatal(err)
			}
			if pe.HasLinearChain() {
				t.Fatal("the plain engine has LinearBackwardChain")
			}
			r := rand.New(rand.NewPCG(uint64(act), 17))
			x, labels := writeBatch(t, chained, r, widths, batch)
			if err := plain.Input().WriteF32(opstest.F32(x)); err != nil {
				t.Fatal(err)
			}
			if err := plain.Labels().Write(tensor.AsBytes(labels)); err != nil {
				t.Fatal(err)
			}
			for _, run := range []struct {
				m *nn.MLP
				e *ops.Engine
			}{{chained, e}, {plain, pe}} {
				if err := run.m.Forward(run.e); err != nil {
					t.Fatal(err)
				}
				if err := run.m.Backward(run.e); err != nil {
					t.Fatal(err)
				}
			}
			for i, p := range chained.Params() {
				q := plain.Params()[i]
				if err := opstest.TermsErr(opstest.Download(t, p.Grad), opstest.Download(t, q.Grad), nil); !(err <= 1e-5) {
					t.Errorf("%s: chained gradient differs from per-layer by %.3g", p.Name, err)
				}
			}
		})
	}
}

// TestMLPOnGraphMatchesChain: the MLP recorded on an ops.Graph (f32) and
// the hand-fused chain, from the same seed on the same batch, give the
// same loss and gradients on the host (both f32; only summation order may
// differ).
func TestMLPOnGraphMatchesChain(t *testing.T) {
	host := device.NewHost()
	e, err := ops.NewEngine(host, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 5))
	x := make([]float32, 16*20)
	y := make([]int32, 16)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	for i := range y {
		y[i] = int32(r.IntN(7))
	}
	var losses [2]float32
	var grads [2][][]float32
	for k, graph := range []*ops.Engine{nil, e} {
		for _, act := range []ops.Act{ops.ActReLU, ops.ActGELU} {
			m, err := nn.NewMLP(device.Local{Dev: host}, nn.MLPConfig{Widths: []int{20, 33, 17, 7}, Act: act, Batch: 16, Seed: seed, Graph: graph})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Input().WriteF32(x); err != nil {
				t.Fatal(err)
			}
			if err := m.Labels().Write(tensor.AsBytes(y)); err != nil {
				t.Fatal(err)
			}
			if err := m.Forward(e); err != nil {
				t.Fatal(err)
			}
			if err := m.Backward(e); err != nil {
				t.Fatal(err)
			}
			l, _ := m.Loss().ReadF32()
			if act == ops.ActGELU {
				losses[k] = l[0]
				grads[k] = nil
				for _, p := range m.Params() {
					g, _ := p.Grad.ReadF32()
					grads[k] = append(grads[k], g)
				}
			}
			m.Free()
		}
	}
	if d := math.Abs(float64(losses[0] - losses[1])); d > 1e-5*math.Abs(float64(losses[0])) {
		t.Fatalf("loss: chain %v, graph %v", losses[0], losses[1])
	}
	for i := range grads[0] {
		for j := range grads[0][i] {
			a, b := grads[0][i][j], grads[1][i][j]
			if math.Abs(float64(a-b)) > 1e-4*(1+math.Abs(float64(a))) {
				t.Fatalf("param %d element %d: chain %v, graph %v", i, j, a, b)
			}
		}
	}
}
