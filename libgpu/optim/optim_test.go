package optim_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

func newModel(t *testing.T, cfg nn.MLPConfig) (*nn.MLP, *ops.Engine, *opstest.PoisonAlloc) {
	t.Helper()
	h := device.NewHost()
	a := &opstest.PoisonAlloc{Dev: h}
	m, err := nn.NewMLP(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Free() })
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m, e, a
}

// blobs is a separable problem: class c is a Gaussian blob (σ 0.5) around
// a random centre in [−2, 2]^d.
type blobs struct {
	r       *rand.Rand
	centres [][]float64
}

func newBlobs(seed uint64, classes, dim int) *blobs {
	r := rand.New(rand.NewPCG(seed, 17))
	b := &blobs{r: r}
	for c := 0; c < classes; c++ {
		v := make([]float64, dim)
		for i := range v {
			v[i] = 4*r.Float64() - 2
		}
		b.centres = append(b.centres, v)
	}
	return b
}

func (b *blobs) batch(n int) ([]float32, []int32) {
	dim := len(b.centres[0])
	x, y := make([]float32, n*dim), make([]int32, n)
	for i := 0; i < n; i++ {
		c := b.r.IntN(len(b.centres))
		y[i] = int32(c)
		for j := 0; j < dim; j++ {
			x[i*dim+j] = float32(b.centres[c][j] + 0.5*b.r.NormFloat64())
		}
	}
	return x, y
}

func load(t *testing.T, m *nn.MLP, x []float32, y []int32) {
	if err := m.Input().WriteF32(x); err != nil {
		t.Fatal(err)
	}
	if err := m.Labels().Write(tensor.AsBytes(y)); err != nil {
		t.Fatal(err)
	}
}

func TestTrainingLowersLoss(t *testing.T) {
	const batch, classes, dim = 32, 4, 8
	mk := map[string]func(a device.Allocator, ps []nn.Param) (optim.Optimizer, error){
		"adamw": func(a device.Allocator, ps []nn.Param) (optim.Optimizer, error) {
			return optim.NewAdamW(a, "run", ps, ops.AdamWConfig{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 1e-2})
		},
		"sgd": func(a device.Allocator, ps []nn.Param) (optim.Optimizer, error) {
			return optim.NewSGD(a, "run", ps, ops.SGDConfig{LR: 0.05, Momentum: 0.9})
		},
		"adamatan2": func(a device.Allocator, ps []nn.Param) (optim.Optimizer, error) {
			return optim.NewAdamATan2(a, "run", ps, ops.AdamATan2Config{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, WeightDecay: 1e-2})
		},
	}
	for name, newOpt := range mk {
		for _, act := range []ops.Act{ops.ActReLU, ops.ActGELU} {
			t.Run(name+"/"+act.String(), func(t *testing.T) {
				m, e, a := newModel(t, nn.MLPConfig{Widths: []int{dim, 32, classes}, Act: act, Batch: batch, Seed: 11})
				o, err := newOpt(a, m.Params())
				if err != nil {
					t.Fatal(err)
				}
				defer o.Free()
				data := newBlobs(3, classes, dim)
				lossOf := func() float64 { return opstest.Download(t, m.Loss())[0] }
				// Mean loss over held-out batches before training.
				eval := func() (loss, acc float64) {
					pred := opstest.Empty(t, device.Local{Dev: e.Device()}, tensor.I32, batch)
					var correct int
					for k := 0; k < 8; k++ {
						x, y := data.batch(batch)
						load(t, m, x, y)
						if err := m.Forward(e); err != nil {
							t.Fatal(err)
						}
						if err := m.Predict(e, pred); err != nil {
							t.Fatal(err)
						}
						for i, p := range opstest.DownloadI32(t, pred) {
							if p == y[i] {
								correct++
							}
						}
						loss += lossOf()
					}
					return loss / 8, float64(correct) / (8 * batch)
				}
				before, _ := eval()
				for step := 0; step < 300; step++ {
					x, y := data.batch(batch)
					load(t, m, x, y)
					if err := m.Forward(e); err != nil {
						t.Fatal(err)
					}
					if err := m.Backward(e); err != nil {
						t.Fatal(err)
					}
					if err := o.Step(e); err != nil {
						t.Fatal(err)
					}
				}
				after, acc := eval()
				t.Logf("loss %.4f → %.4f, held-out accuracy %.3f", before, after, acc)
				if !(after < 0.25*before) || acc < 0.9 {
					t.Fatalf("loss %.4f → %.4f, accuracy %.3f: not trained", before, after, acc)
				}
			})
		}
	}
}

// TestAdamWStepMatchesReference checks the wiring: every param is updated
// from its own gradient with its own moments, as ops' float64 reference.
func TestAdamWStepMatchesReference(t *testing.T) {
	m, e, a := newModel(t, nn.MLPConfig{Widths: []int{5, 7, 3}, Act: ops.ActReLU, Batch: 2, Seed: 1})
	cfg := ops.AdamWConfig{LR: 1e-2, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.05}
	nbefore := len(a.Names)
	o, err := optim.NewAdamW(a, "exp", m.Params(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	var want []string
	for _, p := range m.Params() {
		want = append(want, p.Name+".exp_avg", p.Name+".exp_avg_sq")
	}
	want = append(want, "step")
	var got, gotAlloc []string
	for _, s := range o.State() {
		got = append(got, s.Name)
		if s.Grad != nil {
			t.Errorf("state %s has a gradient", s.Name)
		}
	}
	for _, n := range want {
		gotAlloc = append(gotAlloc, "exp/optim/"+n)
	}
	if !slices.Equal(got, want) || !slices.Equal(a.Names[nbefore:], gotAlloc) {
		t.Fatalf("state %v allocated as %v, want %v", got, a.Names[nbefore:], want)
	}
	for _, s := range o.State()[:len(o.State())-1] {
		for _, v := range opstest.Download(t, s.Value) {
			if v != 0 {
				t.Fatalf("%s not zero-initialised: %v", s.Name, v)
			}
		}
	}
	r := rand.New(rand.NewPCG(8, 8))
	ps := m.Params()
	pf := make([][]float64, len(ps))
	mf := make([][]float64, len(ps))
	vf := make([][]float64, len(ps))
	for i, p := range ps {
		pf[i] = opstest.Download(t, p.Value)
		mf[i], vf[i] = make([]float64, len(pf[i])), make([]float64, len(pf[i]))
	}
	for step := 1; step <= 3; step++ {
		for i, p := range ps {
			g := opstest.Rand(r, p.Grad.Numel())
			if err := p.Grad.WriteF32(g); err != nil {
				t.Fatal(err)
			}
			opstest.AdamWRef(pf[i], opstest.F64(g), mf[i], vf[i], step, cfg)
		}
		if err := o.Step(e); err != nil {
			t.Fatal(err)
		}
		for i, p := range ps {
			if err := opstest.TermsErr(opstest.Download(t, p.Value), pf[i], nil); err > 1e-5 {
				t.Fatalf("step %d %s: relative error %v", step, p.Name, err)
			}
		}
	}
	stepT := o.State()[len(o.State())-1].Value
	if got := opstest.DownloadI32(t, stepT)[0]; got != 3 {
		t.Fatalf("step counter %d, want 3", got)
	}
	// LR 0 (no weight decay effect either): params stay, counter advances.
	o.SetLR(0)
	before := opstest.Download(t, ps[0].Value)
	if err := o.Step(e); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(opstest.Download(t, ps[0].Value), before) {
		t.Fatal("SetLR(0) step changed the parameters")
	}
	if got := opstest.DownloadI32(t, stepT)[0]; got != 4 {
		t.Fatalf("step counter %d, want 4", got)
	}
	// Reset zeroes moments and the counter.
	if err := o.Reset(e); err != nil {
		t.Fatal(err)
	}
	for _, s := range o.State() {
		var nonzero bool
		if s.Value.DType == tensor.I32 {
			nonzero = opstest.DownloadI32(t, s.Value)[0] != 0
		} else {
			nonzero = slices.ContainsFunc(opstest.Download(t, s.Value), func(v float64) bool { return v != 0 })
		}
		if nonzero {
			t.Fatalf("%s not zero after Reset", s.Name)
		}
	}
}

func TestSGDStepMatchesReference(t *testing.T) {
	m, e, a := newModel(t, nn.MLPConfig{Widths: []int{4, 3}, Batch: 2, Seed: 2})
	cfg := ops.SGDConfig{LR: 0.1, Momentum: 0.8, WeightDecay: 0.01}
	o, err := optim.NewSGD(a, "", m.Params(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	if got := a.Names[len(a.Names)-1]; got != "optim/fc0.bias.momentum_buffer" {
		t.Fatalf("last state buffer named %q", got)
	}
	r := rand.New(rand.NewPCG(9, 9))
	ps := m.Params()
	pf := make([][]float64, len(ps))
	bf := make([][]float64, len(ps))
	for i, p := range ps {
		pf[i] = opstest.Download(t, p.Value)
		bf[i] = make([]float64, len(pf[i]))
	}
	for step := 1; step <= 4; step++ {
		if step == 3 {
			o.SetLR(0.03)
			cfg.LR = 0.03
		}
		for i, p := range ps {
			g := opstest.Rand(r, p.Grad.Numel())
			if err := p.Grad.WriteF32(g); err != nil {
				t.Fatal(err)
			}
			opstest.SGDRef(pf[i], opstest.F64(g), bf[i], cfg)
		}
		if err := o.Step(e); err != nil {
			t.Fatal(err)
		}
		for i, p := range ps {
			if err := opstest.TermsErr(opstest.Download(t, p.Value), pf[i], nil); err > 1e-5 || math.IsNaN(err) {
				t.Fatalf("step %d %s: relative error %v", step, p.Name, err)
			}
		}
	}
}

func TestBadParams(t *testing.T) {
	a := device.Local{Dev: device.NewHost()}
	if _, err := optim.NewAdamW(a, "", nil, ops.DefaultAdamW); !errors.Is(err, optim.ErrParams) {
		t.Fatalf("no params: %v, want ErrParams", err)
	}
	w, err := tensor.Alloc(a, "", tensor.F32, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Buf.Free()
	if _, err := optim.NewSGD(a, "", []nn.Param{{Name: "w", Value: w}}, ops.SGDConfig{LR: 1}); !errors.Is(err, optim.ErrParams) {
		t.Fatalf("no gradient: %v, want ErrParams", err)
	}
}
