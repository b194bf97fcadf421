package unet

import (
	"context"
	"io"
	"math"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
)

// TestGPUUNetGraphEqualsEager: the diffusion training step replayed as one
// CUDA graph per staging slot (q_sample, forward, loss, backward, clipping,
// AdamW, EMA) logs the losses of the same steps launched op by op, on the
// default U-Net at batch 16 in bf16; and the loss falls over 30 steps on
// the learnable fake data.
func TestGPUUNetGraphEqualsEager(t *testing.T) {
	d := gpuDevice(t)
	cfg := Default()
	cfg.UNet = nn.DefaultUNet()
	cfg.Batch, cfg.Steps, cfg.Warmup, cfg.LR, cfg.SaveEvery = 16, 30, 3, 1e-3, 1000
	set := fakeFashion(200, 3)
	losses := func(graph bool) []float64 {
		out := t.TempDir()
		o := UNetOptions{Alloc: device.Local{Dev: d}, Precision: ops.PrecBF16, Graph: graph, Run: "g", Train: set, Out: out,
			LogEvery: 1, Stdout: io.Discard}
		if _, err := RunUNet(context.Background(), cfg, o); err != nil {
			t.Fatal(err)
		}
		return unetLosses(t, out)
	}
	eager, graph := losses(false), losses(true)
	for i := range eager {
		if math.Abs(eager[i]-graph[i]) > 1e-6*math.Abs(eager[i]) {
			t.Errorf("step %d: loss %v eager, %v graph", i+1, eager[i], graph[i])
		}
	}
	first, last := mean(graph[:5]), mean(graph[len(graph)-5:])
	if !(last < 0.8*first) {
		t.Errorf("loss from %.4f (first 5 steps) to %.4f (last 5): not learning", first, last)
	}
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

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
