package nn_test

import (
	"bytes"
	"io"
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// TestCUDAMoEGPTGraphEqualsEager: a MoE GPT's training step (forward with
// routing, auxiliary losses, backward through the grouped GEMMs and the
// router) captured as one CUDA graph gives bitwise the loss, the
// auxiliary losses and every gradient of the eager step, in f32 and in
// bf16 autocast — also after new tokens are written (the routing, decided
// on the device, changes with them and the replay follows it) — and its
// losses agree with the host's (f32 within 1e-4, bf16 within 2e-2).
func TestCUDAMoEGPTGraphEqualsEager(t *testing.T) {
	cudatest.RequireGPU(t)
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	moe := nn.MoEConfig{Experts: 8, TopK: 2, Every: 2, AuxLoss: 0.01, ZLoss: 0.001}
	cfg := nn.GPTConfig{Vocab: 65, Layers: 2, Heads: 2, DModel: 64, Block: 32, MoE: &moe}
	const batch = 8
	for _, c := range []struct {
		name string
		prec ops.Precision
		cast tensor.DType
		tol  float64
	}{{"f32", ops.PrecF32, tensor.F32, 1e-4}, {"bf16", ops.PrecBF16, tensor.BF16, 2e-2}} {
		t.Run(c.name, func(t *testing.T) {
			e, err := ops.NewEngine(d, ops.Options{Precision: c.prec})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Impl().(io.Closer).Close() })
			a := device.Local{Dev: d}
			m, err := nn.NewGPT(a, "", cfg, true, 5)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Free()
			s, err := m.Record(e, a, "", batch, ops.GraphOptions{Autocast: c.cast}, true)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Free()
			r := rand.New(rand.NewPCG(seed, 7))
			write := func() ([]int32, []int32) {
				x, y := randTokens(r, batch*cfg.Block, cfg.Vocab), randTokens(r, batch*cfg.Block, cfg.Vocab)
				if err := s.Idx.Write(tensor.AsBytes(x)); err != nil {
					t.Fatal(err)
				}
				if err := s.Targets.Write(tensor.AsBytes(y)); err != nil {
					t.Fatal(err)
				}
				return x, y
			}
			step := func() error {
				if err := s.Graph.Forward(); err != nil {
					return err
				}
				return s.Graph.Backward()
			}
			snapshot := func() [][]byte {
				if err := e.Sync(); err != nil {
					t.Fatal(err)
				}
				var out [][]byte
				for _, v := range append([]*tensor.Tensor{s.Loss, s.AuxLosses}, grads(m)...) {
					b, err := v.Read()
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, b)
				}
				return out
			}
			x, y := write()
			if err := step(); err != nil {
				t.Fatal(err)
			}
			eager := snapshot()
			hostLoss, hostAux := hostMoELoss(t, cfg, batch, x, y)
			gl := f32s(eager[0])[0]
			ga := f32s(eager[1])
			if d := math.Abs(float64(gl)-hostLoss) / hostLoss; !(d <= c.tol) {
				t.Errorf("loss %.6f on the GPU, %.6f on the host (relative %.2g > %.0e)", gl, hostLoss, d, c.tol)
			}
			for i := range hostAux {
				if d := math.Abs(float64(ga[i])-hostAux[i]) / hostAux[i]; !(d <= c.tol) {
					t.Errorf("auxiliary loss %d: %.6f on the GPU, %.6f on the host", i, ga[i], hostAux[i])
				}
			}
			t.Logf("loss %.5f, load-balancing %.4f, z %.4f (host %.5f, %.4f, %.4f)", gl, ga[0], ga[1], hostLoss, hostAux[0], hostAux[1])
			g, err := e.Capture(step)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			for round := 0; round < 2; round++ {
				if round == 1 {
					write()
					if err := step(); err != nil {
						t.Fatal(err)
					}
					eager = snapshot()
				}
				if err := g.Launch(); err != nil {
					t.Fatal(err)
				}
				replay := snapshot()
				for i := range eager {
					if !bytes.Equal(eager[i], replay[i]) {
						t.Fatalf("round %d: tensor %d of the replayed step differs from the eager step", round, i)
					}
				}
			}
		})
	}
}

func grads(m *nn.GPT) []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, p := range m.Params() {
		out = append(out, p.Grad)
	}
	return out
}

func f32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	return v
}

// hostMoELoss is the loss and auxiliary losses of the same model (seed 5)
// on the host, in f32.
func hostMoELoss(t *testing.T, cfg nn.GPTConfig, batch int, x, y []int32) (float64, []float64) {
	t.Helper()
	host := device.NewHost()
	a := device.Local{Dev: host}
	e, err := ops.NewEngine(host, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := nn.NewGPT(a, "", cfg, false, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	s, err := m.Record(e, a, "", batch, ops.GraphOptions{}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Free()
	if err := s.Idx.Write(tensor.AsBytes(x)); err != nil {
		t.Fatal(err)
	}
	if err := s.Targets.Write(tensor.AsBytes(y)); err != nil {
		t.Fatal(err)
	}
	if err := s.Graph.Forward(); err != nil {
		t.Fatal(err)
	}
	l, _ := s.Loss.F32()
	aux, _ := s.AuxLosses.F32()
	return float64(l[0]), []float64{float64(aux[0]), float64(aux[1])}
}
