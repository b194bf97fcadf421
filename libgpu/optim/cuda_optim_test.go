package optim_test

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// gpuProblem is hostProblem on GPU 0 with an engine of precision prec.
func gpuProblem(t *testing.T, prec ops.Precision, shapes ...[]int) *problem {
	t.Helper()
	cudatest.RequireGPU(t)
	d, err := device.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	e, err := ops.NewEngine(d, ops.Options{Precision: prec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Impl().(io.Closer).Close() })
	return newProblem(t, e, device.Local{Dev: d}, shapes...)
}

// gpuShapes: blocks that do not tile, a vector (layer 0's bias for
// K-FAC), an embedding-named matrix (Muon's AdamW), and a matrix wider
// than the largest block.
var gpuShapes = [][]int{{70, 45}, {70}, {33, 70}, {16, 130}}

func gpuNames(p *problem) {
	p.params[0].Name, p.params[1].Name, p.params[2].Name = "l0.weight", "l0.bias", "wte.weight"
}

// gpuSpec is each algorithm's configuration for the GPU checks.
func gpuSpec(t testing.TB, name string, mod func(*optim.Spec)) optim.Spec {
	s, err := optim.Defaults(name)
	if err != nil {
		t.Fatal(err)
	}
	s.MaxBlock, s.UpdateFreq, s.LR = 64, 2, 0.01
	if mod != nil {
		mod(&s)
	}
	return s
}

// runOn runs steps of an optimizer on p from the seeded parameters and
// gradients and returns the parameters.
func runOn(t *testing.T, p *problem, spec optim.Spec, steps int) [][]float64 {
	t.Helper()
	gpuNames(p)
	r := rand.New(rand.NewPCG(77, 78))
	p.set(draws(r, 1, p.shapes))
	var layers []optim.KFACLayer
	if spec.Name == "kfac" { // layer 0's input and output gradient: fixed draws
		x := opstest.Upload(t, p.a, tensor.Float32sOf(draws(r, 1, [][]int{{24 * 45}})[0]), 24, 45)
		dy := opstest.Upload(t, p.a, tensor.Float32sOf(draws(r, 0.1, [][]int{{24 * 70}})[0]), 24, 70)
		layers = []optim.KFACLayer{{Weight: "l0.weight", Bias: "l0.bias", Input: x, OutGrad: dy}}
	}
	o, err := optim.New(p.a, "run", p.params, layers, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	for i := 0; i < steps; i++ {
		p.grads(draws(r, 1, p.shapes))
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
	}
	return p.values()
}

// TestCUDAOptimizersMatchHost runs every algorithm on the GPU at f32,
// TF32 and bf16 engine precision and on the host (the reference, f32
// throughout) from the same parameters and gradients: the GPU's updates
// (parameters minus their start) match the host's to the precision's
// accuracy: f32, 1e-2 of the update (the f32 eigensolver's error on the
// statistics' small eigenvalues, against the host's float64; AdamW 1e-4),
// TF32 and bf16 GEMMs and bf16 Newton–Schulz 5e-2.
func TestCUDAOptimizersMatchHost(t *testing.T) {
	cudatest.RequireGPU(t)
	specs := []struct {
		name string
		mod  func(*optim.Spec)
	}{
		{"adamw", nil},
		{"shampoo", nil},
		{"shampoo", func(s *optim.Spec) { s.Root = "newton" }},
		{"shampoo", func(s *optim.Spec) { s.Async, s.MaxStaleness = true, 1 }},
		{"soap", nil},
		{"muon", nil},
		{"kfac", nil},
	}
	for _, sp := range specs {
		spec := gpuSpec(t, sp.name, sp.mod)
		for _, prec := range []struct {
			name string
			p    ops.Precision
			tol  float64
		}{{"f32", ops.PrecF32, 1e-2}, {"tf32", ops.PrecTF32, 5e-2}, {"bf16", ops.PrecBF16, 5e-2}} {
			t.Run(fmt.Sprintf("%s-%s-async=%v/%s", spec.Name, spec.Root, spec.Async, prec.name), func(t *testing.T) {
				cudatest.RequireGPU(t)
				tol := prec.tol
				if spec.Name == "adamw" && prec.p == ops.PrecF32 {
					tol = 1e-4
				}
				if spec.Name == "muon" {
					tol = 5e-2 // bf16 Newton–Schulz at every precision
				}
				start := roundF32(draws(rand.New(rand.NewPCG(77, 78)), 1, gpuShapes))
				host := runOn(t, hostProblem(t, gpuShapes...), spec, 5)
				gpu := runOn(t, gpuProblem(t, prec.p, gpuShapes...), spec, 5)
				var num, den float64
				for i := range host {
					for k := range host[i] {
						d := gpu[i][k] - host[i][k]
						u := host[i][k] - start[i][k]
						num += d * d
						den += u * u
					}
				}
				if e := math.Sqrt(num / den); !(e <= tol) {
					t.Errorf("GPU vs host: error %.3g of the update (tol %g)", e, tol)
				}
			})
		}
	}
}

// TestCUDAAsyncZeroIsSync: on the GPU, preconditioners computed on the
// side stream and put in use in the same step (staleness 0) give bitwise
// the parameters of synchronous ones, for Shampoo (eigen and Newton), SOAP
// and K-FAC.
func TestCUDAAsyncZeroIsSync(t *testing.T) {
	cudatest.RequireGPU(t)
	for _, sp := range []struct{ name, root string }{{"shampoo", "eigen"}, {"shampoo", "newton"}, {"soap", ""}, {"kfac", "newton"}} {
		t.Run(sp.name+"-"+sp.root, func(t *testing.T) {
			cudatest.RequireGPU(t)
			run := func(async bool) [][]float64 {
				spec := gpuSpec(t, sp.name, func(s *optim.Spec) {
					s.Async = async
					if sp.root != "" {
						s.Root = sp.root
					}
				})
				return runOn(t, gpuProblem(t, ops.PrecTF32, gpuShapes...), spec, 6)
			}
			sameBits(t, "sync vs async", run(false), run(true))
		})
	}
}
