package optim_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// optimScript is the PyTorch reference of the update rules, written from
// the papers. The GPU bundle, which has no source tree, carries it in
// testdata/ (scripts/gpu-files.txt).
const optimScript = "../../bench/reference/optim.py"

func bundledScript() string {
	if _, err := os.Stat(optimScript); err == nil {
		return optimScript
	}
	return filepath.Join("testdata", filepath.Base(optimScript))
}

// requireTorch skips without python3 and torch, unless the machine must
// have them (GPUKIT_REQUIRE_GPU=1: the GPU machine), where it fails.
func requireTorch(t *testing.T) {
	t.Helper()
	if err := exec.Command("python3", "-c", "import torch, safetensors").Run(); err != nil {
		if os.Getenv(cudatest.EnvRequireGPU) == "1" {
			t.Fatalf("python3 with torch and safetensors is required here: %v", err)
		}
		t.Skipf("no python3 with torch and safetensors: %v", err)
	}
}

// TestTorchParity runs Shampoo (asynchronous roots, one step stale), SOAP,
// Muon and K-FAC on the host for a few steps and bench/reference/optim.py,
// PyTorch's float64 implementation written from the papers, on the same
// parameters and gradients: the parameters agree to f32's accuracy
// relative to the run's update (Muon: to its bf16 Newton–Schulz's).
func TestTorchParity(t *testing.T) {
	requireTorch(t)
	cases := []struct {
		name   string
		shapes [][]int
		names  []string
		mod    func(s *optim.Spec)
		tol    float64
	}{
		{"shampoo", [][]int{{7, 5}, {4}, {3, 3}}, nil, func(s *optim.Spec) {
			s.MaxBlock, s.StartStep, s.UpdateFreq, s.RelEps, s.LR, s.WeightDecay = 3, 2, 2, 1e-3, 0.05, 0.01
			s.Async, s.MaxStaleness = true, 1
		}, 1e-4},
		{"soap", [][]int{{6, 6}, {4}, {4, 4}}, nil, func(s *optim.Spec) { s.MaxBlock, s.UpdateFreq, s.LR = 3, 3, 0.02 }, 1e-4},
		// Muon's bf16 Newton–Schulz against the reference's float64: the
		// per-step bound muonBF16Tol holds for the whole run's update too
		// (steps' errors partly cancel, and AdamW's parameters are exact
		// to f32): 0.0103 = 2.6u on an H100's run, deterministic (host).
		{"muon", [][]int{{6, 9}, {11, 4}, {5, 3}, {6}}, []string{"h.0.weight", "h.1.weight", "wte.weight", "ln.weight"},
			func(s *optim.Spec) { s.WeightDecay = 0.1 }, muonBF16Tol},
		{"kfac", [][]int{{5, 4}, {5}, {3, 5}, {6}}, []string{"l0.weight", "l0.bias", "l1.weight", "norm.weight"},
			func(s *optim.Spec) { s.UpdateFreq, s.Damping, s.KLClip, s.WeightDecay = 2, 0.01, 0.05, 0.01 }, 1e-4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			spec, err := optim.Defaults(c.name)
			if err != nil {
				t.Fatal(err)
			}
			c.mod(&spec)
			p := hostProblem(t, c.shapes...)
			names := c.names
			if names == nil {
				names = p.names()
			}
			for i := range p.params {
				p.params[i].Name = names[i]
			}
			r := rand.New(rand.NewPCG(51, 52))
			w0 := roundF32(draws(r, 1, c.shapes))
			p.set(w0)
			var entries []ckpt.Entry
			add := func(name string, shape []int, v []float64) {
				entries = append(entries, ckpt.Entry{Name: name, DType: tensor.F32, Shape: shape, Data: tensor.AsBytes(tensor.Float32sOf(v))})
			}
			for i, v := range w0 {
				add(fmt.Sprintf("p%d", i), c.shapes[i], v)
			}
			var layers []optim.KFACLayer
			var io [][2]*tensor.Tensor
			if c.name == "kfac" {
				for _, sh := range [][2]int{{4, 5}, {5, 3}} {
					io = append(io, [2]*tensor.Tensor{newT(t, p, 9, sh[0]), newT(t, p, 9, sh[1])})
				}
				layers = []optim.KFACLayer{{Weight: "l0.weight", Bias: "l0.bias", Input: io[0][0], OutGrad: io[0][1]},
					{Weight: "l1.weight", Input: io[1][0], OutGrad: io[1][1]}}
			}
			o, err := optim.New(p.a, "run", p.params, layers, spec)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Free()
			const steps = 6
			for s := 0; s < steps; s++ {
				for k, pair := range io {
					for j, tt := range pair {
						v := roundF32(draws(r, []float64{1, 0.1}[j], [][]int{tt.Shape}))[0]
						if err := tt.WriteFloat32(tensor.Float32sOf(v)); err != nil {
							t.Fatal(err)
						}
						add(fmt.Sprintf("%s%d_%d", []string{"x", "dy"}[j], s, k), tt.Shape, v)
					}
				}
				g := roundF32(draws(r, 1, c.shapes))
				for i, v := range g {
					add(fmt.Sprintf("g%d_%d", s, i), c.shapes[i], v)
				}
				p.grads(g)
				if err := o.Step(p.e); err != nil {
					t.Fatal(err)
				}
			}
			for i, v := range p.values() {
				add(fmt.Sprintf("w%d", i), c.shapes[i], v)
			}
			sj, _ := json.Marshal(spec)
			nj, _ := json.Marshal(names)
			var lj []byte
			if layers != nil {
				lj, _ = json.Marshal([]map[string]string{{"weight": "l0.weight", "bias": "l0.bias"}, {"weight": "l1.weight"}})
			}
			path := filepath.Join(t.TempDir(), "parity.safetensors")
			if err := ckpt.WriteFile(path, entries, map[string]string{"spec": string(sj), "names": string(nj),
				"layers": string(lj), "steps": fmt.Sprint(steps)}); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("python3", bundledScript(), "parity", path).CombinedOutput()
			if err != nil {
				t.Fatalf("optim.py: %v\n%s", err, out)
			}
			var res struct {
				RelErr float64 `json:"rel_err"`
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
				t.Fatalf("optim.py said %q", out)
			}
			t.Logf("%s: relative error %.3g against PyTorch", c.name, res.RelErr)
			if !(res.RelErr <= c.tol) {
				t.Errorf("%s: relative error %.3g against PyTorch (tol %g)", c.name, res.RelErr, c.tol)
			}
		})
	}
}

// newT allocates a rows × cols f32 tensor of p's allocator.
func newT(t *testing.T, p *problem, rows, cols int) *tensor.Tensor {
	t.Helper()
	x, err := tensor.Alloc(p.a, "", tensor.F32, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Buf.Free() })
	return x
}
