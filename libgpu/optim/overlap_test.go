package optim_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// stepBoth trains two copies of one random MLP on dev for steps steps on the
// same random batches, one with Backward then Step, the other with
// BackwardStep overlapped, and fails unless parameters and optimizer state
// are bitwise equal after every step.
func stepBoth(t *testing.T, dev device.Device, kind string, steps int) {
	t.Helper()
	a := device.Local{Dev: dev}
	e, err := ops.NewEngine(dev, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if c, ok := e.Impl().(io.Closer); ok {
			c.Close()
		}
	}()
	cfg := nn.MLPConfig{Widths: []int{13, 24, 17, 5}, Act: ops.ActReLU, Batch: 9, Seed: rand.Uint64()}
	type run struct {
		m   *nn.MLP
		opt optim.Optimizer
	}
	var runs [2]run
	for i := range runs {
		m, err := nn.NewMLP(a, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Free()
		var opt optim.Optimizer
		if kind == "adamw" {
			opt, err = optim.NewAdamW(a, "", m.Params(), ops.AdamWConfig{LR: 1e-2, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.05})
		} else {
			opt, err = optim.NewSGD(a, "", m.Params(), ops.SGDConfig{LR: 1e-2, Momentum: 0.9, WeightDecay: 0.05})
		}
		if err != nil {
			t.Fatal(err)
		}
		defer opt.Free()
		runs[i] = run{m, opt}
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 3))
	for k := 1; k <= steps; k++ {
		x := make([]float32, cfg.Batch*cfg.Widths[0])
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		y := make([]int32, cfg.Batch)
		for i := range y {
			y[i] = int32(r.IntN(cfg.Widths[3]))
		}
		for i, ru := range runs {
			if err := ru.m.Input().WriteF32(x); err != nil {
				t.Fatal(err)
			}
			if err := ru.m.Labels().Write(tensor.AsBytes(y)); err != nil {
				t.Fatal(err)
			}
			if err := ru.m.Forward(e); err != nil {
				t.Fatal(err)
			}
			if err := optim.BackwardStep(e, ru.m, ru.opt, i == 1); err != nil {
				t.Fatal(err)
			}
		}
		var got [2][][]byte
		for i, ru := range runs {
			ts := []*tensor.Tensor{}
			for _, p := range ru.m.Params() {
				ts = append(ts, p.Value)
			}
			for _, s := range ru.opt.State() {
				ts = append(ts, s.Value)
			}
			for _, tt := range ts {
				b, err := tt.Read()
				if err != nil {
					t.Fatal(err)
				}
				got[i] = append(got[i], b)
			}
		}
		for j := range got[0] {
			if !bytes.Equal(got[0][j], got[1][j]) {
				t.Fatalf("step %d: tensor %d differs between the serial and the overlapped step", k, j)
			}
		}
	}
}

func TestBackwardStepOverlapMatchesSerial(t *testing.T) {
	for _, kind := range []string{"adamw", "sgd"} {
		t.Run(kind, func(t *testing.T) { stepBoth(t, device.NewHost(), kind, 5) })
	}
}

// TestGPUBackwardStepOverlapMatchesSerial: the updates on the side stream,
// forked per layer from the backward, give bitwise the serial results.
func TestGPUBackwardStepOverlapMatchesSerial(t *testing.T) {
	cudatest.RequireGPU(t)
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, kind := range []string{"adamw", "sgd"} {
		t.Run(kind, func(t *testing.T) {
			cudatest.RequireGPU(t)
			stepBoth(t, d, kind, 20)
		})
	}
}

func TestBackwardStepForeignOptimizer(t *testing.T) {
	cfg := nn.MLPConfig{Widths: []int{4, 3, 2}, Act: ops.ActReLU, Batch: 2, Seed: 1}
	m1, e, a := newModel(t, cfg)
	m2, _, _ := newModel(t, cfg)
	opt, err := optim.NewAdamW(a, "", m2.Params(), ops.DefaultAdamW)
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Free()
	if err := m1.Labels().Write(make([]byte, m1.Labels().Bytes())); err != nil {
		t.Fatal(err)
	}
	if err := m1.Forward(e); err != nil {
		t.Fatal(err)
	}
	err = optim.BackwardStep(e, m1, opt, true)
	if !errors.Is(err, optim.ErrParams) {
		t.Fatal(fmt.Errorf("optimizer of another model: error %v, want ErrParams", err))
	}
}
