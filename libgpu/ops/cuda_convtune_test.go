package ops_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/kernels"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// TestCUDAConvTuned: with the per-shape path choice on (convtune.go), bf16
// convolutions whose paths differ in speed (8×8×256 → 256, where im2col
// won on an H100, and 32×32×64 → 64, where the implicit GEMM did) give the
// host backend's results, forward and backward (input gradient, f32
// weight gradient); their choices land in the cache directory's
// gemm-algos.json as "conv|" keys of each pass naming an allowed path; a
// second engine (as a second process) computes bitwise the same outputs
// from the stored choices, and those are bitwise the outputs of each
// chosen path run without tuning: the choice is deterministic once
// cached. Under both policies: mma.sync and wgmma (the default).
func TestCUDAConvTuned(t *testing.T) {
	d := gpu(t)
	defer ops.SetConvTune(true)()
	cache, err := kernels.DefaultCacheDir()
	if err != nil {
		t.Fatalf("no cache directory: %v", err)
	}
	seed := opstest.TestSeed(t)
	r := rand.New(rand.NewPCG(seed, 11))
	host := device.NewHost()
	he, err := ops.NewEngine(host, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, policy := range []struct {
		name string
		path int
	}{{"mma", ops.ConvMMA}, {"wg", ops.ConvWG}} {
		t.Run(policy.name, func(t *testing.T) {
			defer ops.SetConvPath(policy.path)()
			for _, s := range []struct{ n, hw, cin, cout int }{{16, 8, 256, 256}, {8, 32, 64, 64}} {
				xv := opstest.Rand(r, s.n*s.hw*s.hw*s.cin)
				wv := opstest.Rand(r, s.cout*9*s.cin)
				for i := range wv {
					wv[i] /= float32(math.Sqrt(float64(9 * s.cin)))
				}
				bv := opstest.Rand(r, s.cout)
				dyv := opstest.Rand(r, s.n*s.hw*s.hw*s.cout)
				// run returns y, dx and dw.
				run := func(e *ops.Engine, dev device.Device) [3][]float32 {
					a := device.Local{Dev: dev}
					x, w, b := opstest.Empty(t, a, tensor.BF16, s.n, s.hw, s.hw, s.cin), opstest.Empty(t, a, tensor.BF16, s.cout, 3, 3, s.cin), opstest.Empty(t, a, tensor.BF16, s.cout)
					y, dy := opstest.Empty(t, a, tensor.BF16, s.n, s.hw, s.hw, s.cout), opstest.Empty(t, a, tensor.BF16, s.n, s.hw, s.hw, s.cout)
					dx, dw := opstest.Empty(t, a, tensor.BF16, x.Shape...), opstest.Empty(t, a, tensor.F32, w.Shape...)
					for _, p := range []struct {
						t *tensor.Tensor
						v []float32
					}{{x, xv}, {w, wv}, {b, bv}, {dy, dyv}} {
						if err := p.t.WriteFloat32(p.v); err != nil {
							t.Fatal(err)
						}
					}
					p := ops.Conv2DParams{Stride: 1, Pad: 1}
					if err := e.Conv2D(y, x, w, b, p); err != nil {
						t.Fatal(err)
					}
					if err := e.Conv2DBackward(dx, dw, nil, dy, x, w, p, [3]bool{}); err != nil {
						t.Fatal(err)
					}
					var out [3][]float32
					for i, o := range []*tensor.Tensor{y, dx, dw} {
						if out[i], err = o.ReadFloat32(); err != nil {
							t.Fatal(err)
						}
					}
					return out
				}
				name := fmt.Sprintf("%dx%dx%dx%d→%d", s.n, s.hw, s.hw, s.cin, s.cout)
				want := run(he, host)
				got := run(cudaEngine(t, d, ops.PrecBF16), d)
				passes := []string{"fwd", "bwd-dx", "bwd-dw"}
				for i := range got {
					if e := opstest.TermsErr(opstest.F64(got[i]), opstest.F64(want[i]), nil); !(e <= 2e-2) {
						t.Errorf("%s %s: relative error %.3g > 2e-2", name, passes[i], e)
					}
				}
				b, err := os.ReadFile(filepath.Join(cache, "gemm-algos.json"))
				if err != nil {
					t.Fatalf("no tuning table: %v", err)
				}
				var table map[string]int
				if err := json.Unmarshal(b, &table); err != nil {
					t.Fatal(err)
				}
				again := run(cudaEngine(t, d, ops.PrecBF16), d)
				for i, pass := range passes {
					chosen := -1
					for k, v := range table {
						if strings.HasPrefix(k, "conv|") && strings.Contains(k, "|"+pass+"|") &&
							strings.Contains(k, fmt.Sprintf("n%d h%d w%d cin%d cout%d ", s.n, s.hw, s.hw, s.cin, s.cout)) &&
							strings.HasSuffix(k, fmt.Sprintf("|policy%d", policy.path)) {
							chosen = v
						}
					}
					if chosen == -1 && pass == "bwd-dw" && policy.path == ops.ConvMMA {
						chosen = ops.ConvIm2col // its only candidate: nothing to time, nothing stored
					}
					if chosen != ops.ConvMMA && chosen != ops.ConvIm2col && (chosen != ops.ConvWG || policy.path != ops.ConvWG) ||
						pass == "bwd-dw" && chosen == ops.ConvMMA {
						t.Fatalf("%s %s: the table's choice is %d (table %s)", name, pass, chosen, b)
					}
					t.Logf("%s %s: path %d", name, pass, chosen)
					if !equalF32(again[i], got[i]) {
						t.Errorf("%s %s: a second engine's outputs differ from the first's", name, pass)
					}
					func() {
						defer ops.SetConvTune(false)()
						defer ops.SetConvPath(chosen)()
						if forced := run(cudaEngine(t, d, ops.PrecBF16), d); !equalF32(forced[i], got[i]) {
							t.Errorf("%s %s: the chosen path %d run alone gives other outputs", name, pass, chosen)
						}
					}()
				}
			}
		})
	}
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
