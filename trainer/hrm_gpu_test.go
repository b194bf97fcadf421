package main

// GPU-machine tests of --model hrm through the binary: the segment step
// and the evaluation replayed as CUDA graphs give what their eager runs
// give, and trainer run trains as bench/reference/hrm.py does, step by
// step, on the batches `trainer data replay` writes for the same seed.

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
)

// hrmScript is the PyTorch reference (in testdata/ of the GPU bundle:
// scripts/gpu-files.txt).
const hrmScript = "../bench/reference/hrm.py"

// hrmLossLines are the loss lines of trainer run --model hrm's stdout as
// maps, without the timing fields (sequences_per_s, step_ms, mfu,
// elapsed_s), and its evaluation lines likewise.
func hrmLossLines(t *testing.T, stdout string) (loss, evals []map[string]any) {
	t.Helper()
	for _, s := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("not a JSON line: %q", s)
		}
		for _, k := range []string{"sequences_per_s", "step_ms", "mfu", "elapsed_s"} {
			delete(m, k)
		}
		if _, ok := m["loss"]; ok {
			loss = append(loss, m)
		} else {
			evals = append(evals, m)
		}
	}
	return loss, evals
}

// TestGPUHRMGraphEqualsEager: the default HRM (bf16, batch 32) trains 6
// segment steps with --graph on (the step captured after its first run
// and replayed; each evaluation batch one captured graph whose segment
// loop is a conditional WHILE node) and with --graph off (op by op, the
// evaluation loop driven from the host): the same loss lines and
// evaluations, bit for bit, and the same model file; the loss lines
// carry mfu.
func TestGPUHRMGraphEqualsEager(t *testing.T) {
	cudatest.RequireGPU(t)
	data, _ := hrmData(t, rand.Uint64(), 96)
	run := func(graph string) (string, string) {
		out := t.TempDir()
		r := trainer(t, "run", "--model", "hrm", "--data", data, "--out", out, "--force", "--device", "cuda", "--precision", "bf16",
			"--graph", graph, "--batch", "32", "--steps", "6", "--warmup", "2", "--log-every", "1", "--eval-every", "3",
			"--eval-n", "80", "--num-aug", "10", "--seed", "5")
		mustOK(t, r)
		return r.stdout, out
	}
	eager, eo := run("off")
	graph, gout := run("on")
	el, ee := hrmLossLines(t, eager)
	gl, ge := hrmLossLines(t, graph)
	if len(el) != 6 || len(ee) != 2 || fmt.Sprint(el) != fmt.Sprint(gl) || fmt.Sprint(ee) != fmt.Sprint(ge) {
		t.Fatalf("--graph off:\n%s\n--graph on:\n%s", eager, graph)
	}
	if !strings.Contains(graph, `"mfu":`) {
		t.Errorf("no mfu on the GPU's loss lines:\n%s", graph)
	}
	a, err1 := os.ReadFile(filepath.Join(eo, "model.safetensors"))
	b, err2 := os.ReadFile(filepath.Join(gout, "model.safetensors"))
	if err1 != nil || err2 != nil || string(a) != string(b) {
		t.Errorf("the model files differ (%v, %v)", err1, err2)
	}
	t.Logf("evaluations: %v", ge)
}

// TestGPUHRMTorchParity: trainer run --model hrm on the GPU (the step a
// CUDA graph) against hrm.py parity on the GPU over 50 segment steps at
// the default architecture and batch 32, from the same initial weights
// (trainer init) on the same batches (trainer data replay with the run's
// --data-seed, --num-aug, batch and halting settings): every step's
// losses within 1e-4 (f32, TF32 off on both sides) or 2e-2 (bf16) of
// hrm.py's, the same number of sequences halted, the same learning rate.
// (libgpu/nn's TestHRMTorchParity holds the model to the same bounds;
// this holds the trainer's data, schedule and flags to them.)
func TestGPUHRMTorchParity(t *testing.T) {
	cudatest.RequireGPU(t)
	if err := exec.Command("python3", "-c", "import torch, safetensors").Run(); err != nil {
		t.Fatalf("python3 with torch and safetensors is required on the GPU machine: %v", err)
	}
	for _, c := range []struct {
		prec string
		tol  float64
	}{{"f32", 1e-4}, {"bf16", 2e-2}} {
		t.Run(c.prec, func(t *testing.T) {
			seed := rand.Uint64() % (1 << 31)
			t.Logf("seed %d", seed)
			data, _ := hrmData(t, seed, 64)
			dir := t.TempDir()
			initPath, replay := filepath.Join(dir, "init.safetensors"), filepath.Join(dir, "replay.safetensors")
			const steps, batch, warmup = 50, 32, 10
			s := strconv.FormatUint(seed, 10)
			mustOK(t, trainer(t, "data", "replay", "--set", filepath.Join(data, "train.safetensors"), "--out", replay,
				"--steps", strconv.Itoa(steps), "--batch", strconv.Itoa(batch), "--num-aug", "10", "--seed", s))
			mustOK(t, trainer(t, "init", "--model", "hrm", "--data", data, "--out", initPath, "--seed", s))
			cmd := exec.Command("python3", bundled(hrmScript), "parity", "--init", initPath, "--replay", replay, "--dtype", c.prec,
				"--device", "cuda", "--lr", "1e-4", "--puzzle-emb-lr", "1e-4", "--warmup", strconv.Itoa(warmup))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			pyOut, err := cmd.Output()
			if err != nil {
				t.Fatalf("hrm.py parity: %v\n%s", err, stderr.String())
			}
			r := trainer(t, "run", "--model", "hrm", "--data", data, "--out", filepath.Join(dir, "run"), "--device", "cuda",
				"--precision", c.prec, "--graph", "on", "--steps", strconv.Itoa(steps), "--batch", strconv.Itoa(batch),
				"--num-aug", "10", "--seed", s, "--data-seed", s, "--warmup", strconv.Itoa(warmup), "--log-every", "1",
				"--eval-every", "1000", "--eval-n", "32")
			mustOK(t, r)
			got, _ := hrmLossLines(t, r.stdout)
			want := strings.Split(strings.TrimSpace(string(pyOut)), "\n")
			if len(got) != steps || len(want) != steps {
				t.Fatalf("%d loss lines, hrm.py %d", len(got), len(want))
			}
			worst := 0.0
			for i := range got {
				var w map[string]any
				if err := json.Unmarshal([]byte(want[i]), &w); err != nil {
					t.Fatalf("hrm.py line %q", want[i])
				}
				e := 0.0
				for _, k := range []string{"loss", "lm_loss", "q_halt_loss", "q_continue_loss"} {
					g, x := got[i][k].(float64), w[k].(float64)
					e = max(e, math.Abs(g-x)/math.Max(math.Abs(x), 1e-3))
				}
				worst = max(worst, e)
				if got[i]["count"].(float64) != w["count"].(float64) {
					t.Fatalf("step %d: %v sequences halted, %v in hrm.py", i+1, got[i]["count"], w["count"])
				}
				if e > c.tol {
					t.Fatalf("step %d: losses %v, hrm.py %s: relative difference %.3g (tolerance %.3g)", i+1, got[i], want[i], e, c.tol)
				}
				if g, x := got[i]["lr"].(float64), w["lr"].(float64); math.Abs(g-x) > 1e-6*x {
					t.Errorf("step %d: learning rate %v, hrm.py %v", i+1, g, x)
				}
			}
			t.Logf("%d steps: largest relative loss difference %.3g", steps, worst)
		})
	}
}
