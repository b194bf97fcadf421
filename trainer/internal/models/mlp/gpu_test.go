package mlp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
	"gpukit/trainer/internal/driver"
)

// gpuDevice opens GPU 0 for the test (skips without one; fails when
// GPUKIT_REQUIRE_GPU=1).
func gpuDevice(t *testing.T) *device.CUDA {
	t.Helper()
	cudatest.RequireGPU(t)
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// trainRandom trains a fresh model of cfg for steps steps on random batches
// drawn from seed, through the stepper (graph or eager), reading the loss
// after every step. It returns the losses, the gradient norms (with
// clipping) and the final parameters and optimizer state.
func trainRandom(t *testing.T, d *device.CUDA, cfg Config, prec ops.Precision, graph bool, steps int, seed uint64) ([]float32, []float32, [][]byte) {
	t.Helper()
	a := device.Local{Dev: d}
	e, err := ops.NewEngine(d, ops.Options{Precision: prec})
	if err != nil {
		t.Fatal(err)
	}
	defer driver.CloseEngine(e)
	m, err := newModelOn(a, cfg, "", cfg.Batch, true, e, prec)
	if err != nil {
		t.Fatal(err)
	}
	defer m.free()
	st, err := newStepper(e, m, graph)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !e.IsGraphCapable() {
		t.Fatalf("engine on %v is not a CUDA engine", d)
	}
	r := rand.New(rand.NewPCG(seed, 4))
	var losses, norms []float32
	for range steps {
		x, y, err := st.batch()
		if err != nil {
			t.Fatal(err)
		}
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		// Learnable labels: the index of the largest of the first C inputs.
		d, c := cfg.Widths[0], cfg.Widths[len(cfg.Widths)-1]
		for i := range y {
			best := 0
			for j := range c {
				if x[i*d+j] > x[i*d+best] {
					best = j
				}
			}
			y[i] = int32(best)
		}
		if err := st.Run(); err != nil {
			t.Fatal(err)
		}
		l, err := m.mlp.Loss().ReadF32()
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, l[0])
		if m.norm != nil {
			n, err := m.norm.ReadF32()
			if err != nil {
				t.Fatal(err)
			}
			norms = append(norms, n[0])
		}
	}
	var state [][]byte
	for _, nt := range m.tensors(true) {
		b, err := nt.T.Read()
		if err != nil {
			t.Fatal(err)
		}
		state = append(state, b)
	}
	return losses, norms, state
}

// TestGPUGraphMatchesEager: 100 steps replayed from the captured graphs
// (pinned staging copy inside) give bitwise the losses, gradient norms,
// parameters and optimizer state of 100 eager steps, at f32 and TF32, with
// and without clipping and with ReLU and GELU. None of the step's kernels
// uses float atomics, so equality is exact.
func TestGPUGraphMatchesEager(t *testing.T) {
	d := gpuDevice(t)
	for _, c := range []struct {
		prec ops.Precision
		act  string
		clip float32
	}{{ops.PrecF32, "relu", 0}, {ops.PrecF32, "gelu", 0.5}, {ops.PrecTF32, "relu", 1}} {
		t.Run(fmt.Sprintf("prec=%d/%s/clip=%v", c.prec, c.act, c.clip), func(t *testing.T) {
			cudatest.RequireGPU(t)
			cfg := Default()
			cfg.Widths, cfg.Batch, cfg.Act, cfg.Clip, cfg.Seed, cfg.LR = []int{50, 64, 48, 10}, 32, c.act, c.clip, rand.Uint64(), 1e-2
			seed := rand.Uint64()
			const steps = 100
			le, ne, se := trainRandom(t, d, cfg, c.prec, false, steps, seed)
			lg, ng, sg := trainRandom(t, d, cfg, c.prec, true, steps, seed)
			for i := range le {
				if le[i] != lg[i] {
					t.Fatalf("step %d: loss %v eager, %v graph", i+1, le[i], lg[i])
				}
			}
			for i := range ne {
				if ne[i] != ng[i] {
					t.Fatalf("step %d: grad norm %v eager, %v graph", i+1, ne[i], ng[i])
				}
			}
			if c.clip > 0 && len(ng) != steps {
				t.Fatalf("%d gradient norms", len(ng))
			}
			for i := range se {
				if !bytes.Equal(se[i], sg[i]) {
					t.Fatalf("state tensor %d differs between graph and eager", i)
				}
			}
			if first, last := meanOf(le[:10]), meanOf(le[steps-10:]); !(last < 0.8*first) {
				t.Fatalf("mean loss %v over the first 10 steps, %v over the last 10: not learning", first, last)
			}
		})
	}
}

func meanOf(v []float32) float64 {
	s := 0.0
	for _, x := range v {
		s += float64(x)
	}
	return s / float64(len(v))
}

// stepper runs the MLP trainer's steps (its inputs, Compute and PostStep,
// as the driver wires them) through a driver.Runner, with batches the
// test writes.
type stepper struct {
	*driver.Runner
}

func newStepper(e *ops.Engine, m *model, graph bool) (*stepper, error) {
	tr := &trainer{m: m, e: e}
	r, err := driver.NewRunner(e, tr.Inputs(), tr.Compute, graph && tr.Capturable())
	if err != nil {
		return nil, err
	}
	if post := tr.PostStep(); post != nil {
		r.SetPost(func(gt *trace.GPUTimer) error { return post(0, gt) })
	}
	return &stepper{Runner: r}, nil
}

// batch waits for a free slot and returns its input and label memory.
func (s *stepper) batch() ([]float32, []int32, error) {
	b, err := s.Stage()
	if err != nil {
		return nil, nil, err
	}
	return tensor.BytesAs[float32](s.View(b, 0)), tensor.BytesAs[int32](s.View(b, 1)), nil
}
