package main

import (
	"testing"

	"gpukit/libgpu/cuda/cudatest"
)

// TestGPUPhaseGraphsEqualEager: with phase graphs (the default) the
// second-order optimizers' steps are replayed from a CUDA graph per phase
// (Shampoo, SOAP and Muon's GPT; K-FAC's MLP, its forward and backward
// per phase of its factor hooks too) and the run logs bitwise the losses
// of the run that steps them eagerly.
func TestGPUPhaseGraphsEqualEager(t *testing.T) {
	cudatest.RequireGPU(t)
	text := gptText(t)
	gpt := []string{"run", "--model", "gpt", "--data", text, "--steps", "30", "--log-every", "1", "--layers", "2",
		"--d-model", "128", "--block", "64", "--batch", "8", "--precision", "bf16", "--update-freq", "4"}
	mlp := []string{"run", "--data", gpuData(t), "--device", "cuda", "--epochs", "1", "--limit", "3840", "--log-every", "1",
		"--precision", "bf16", "--update-freq", "4"}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"gpt-shampoo", append(gpt, "--optim", "shampoo")},
		{"gpt-soap", append(gpt, "--optim", "soap")},
		{"mlp-kfac", append(mlp, "--optim", "kfac")},
	} {
		t.Run(c.name, func(t *testing.T) {
			var runs [2][]float64
			for i, on := range []string{"1", "0"} {
				t.Setenv("GPUKIT_OPTIM_PHASES", on)
				r := trainer(t, append(append([]string(nil), c.args...), "--out", t.TempDir())...)
				mustOK(t, r)
				runs[i], _ = stepLosses(t, r.stdout)
			}
			if len(runs[0]) == 0 || len(runs[0]) != len(runs[1]) {
				t.Fatalf("%d and %d loss lines", len(runs[0]), len(runs[1]))
			}
			for i := range runs[0] {
				if runs[0][i] != runs[1][i] {
					t.Fatalf("step %d: phase graphs %v, eager %v", i+1, runs[0][i], runs[1][i])
				}
			}
		})
	}
}
