package ops_test

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// wishart fills a [batch, n, n] f32 tensor with G·Gᵀ/n (G [n, n] of
// N(0, 1) draws per matrix, the product on the GPU): symmetric positive
// semi-definite statistics with Marchenko–Pastur eigenvalues in (0, 4],
// the smallest near 0, as gradient statistics are.
func wishart(t testing.TB, e *ops.Engine, a device.Allocator, r *rand.Rand, batch, n int) *tensor.Tensor {
	t.Helper()
	g := make([]float32, batch*n*n)
	for i := range g {
		g[i] = float32(r.NormFloat64())
	}
	gt := opstest.Upload(t, a, g, batch, n, n)
	s := opstest.Empty(t, a, tensor.F32, batch, n, n)
	if err := e.Matmul(ops.Matmul{A: gt, B: gt, D: s, TransB: true, Alpha: 1 / float32(n)}); err != nil {
		t.Fatal(err)
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	return s
}

// rootRelErr is ‖x − ref‖_F/‖ref‖_F per matrix, the largest.
func rootRelErr(t testing.TB, x, ref *tensor.Tensor, batch, n int) float64 {
	t.Helper()
	xv, err := x.ReadFloat32()
	if err != nil {
		t.Fatal(err)
	}
	rv, err := ref.ReadFloat32()
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for b := 0; b < batch; b++ {
		e := opstest.RelErr(opstest.F64(xv[b*n*n:(b+1)*n*n]), opstest.F64(rv[b*n*n:(b+1)*n*n]))
		worst = math.Max(worst, e)
	}
	return worst
}

// TestCUDAInverseRootLarge: on matrices of the sizes Shampoo meets (a
// batch of 4 of order 512, Wishart statistics, ridge 1e-4·‖A‖_F), the
// float64 eigendecomposition is the reference; the f32 one and the Newton
// iteration (TF32 and full f32 GEMMs) match it, Newton within its stated
// bound δ/(p(1−δ)) for the residual δ it reports (slack for TF32 rounding).
func TestCUDAInverseRootLarge(t *testing.T) {
	d := gpu(t)
	a := device.Local{Dev: d}
	const batch, n, p, relEps = 4, 512, 4, 1e-4
	for _, prec := range []struct {
		name string
		p    ops.Precision
		tol  float64
	}{{"f32", ops.PrecF32, 2e-3}, {"tf32", ops.PrecTF32, 2e-2}} {
		t.Run(prec.name, func(t *testing.T) {
			cudatest.RequireGPU(t)
			e := cudaEngine(t, d, prec.p)
			s := wishart(t, e, a, rand.New(rand.NewPCG(1, 2)), batch, n)
			ref := opstest.Empty(t, a, tensor.F32, batch, n, n)
			must := func(what string, err error) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			}
			must("eigen f64", e.InverseRoot(ops.InverseRoot{A: s, X: ref, P: p, RelEps: relEps, Method: ops.RootEigen, F64: true}))
			x := opstest.Empty(t, a, tensor.F32, batch, n, n)
			errT := opstest.Empty(t, a, tensor.F32, batch)
			must("eigen f32", e.InverseRoot(ops.InverseRoot{A: s, X: x, P: p, RelEps: relEps, Method: ops.RootEigen, Err: errT}))
			must("sync", e.Sync())
			if re := rootRelErr(t, x, ref, batch, n); !(re < 1e-3) {
				t.Errorf("eigen f32 vs f64: relative error %.3g", re)
			}
			must("newton", e.InverseRoot(ops.InverseRoot{A: s, X: x, P: p, RelEps: relEps, Method: ops.RootNewton, Err: errT}))
			must("sync", e.Sync())
			ev, _ := errT.ReadFloat32()
			re := rootRelErr(t, x, ref, batch, n)
			dmax := float64(slices.Max(ev))
			t.Logf("Newton (%d iterations): relative error %.3g, residuals δ %v", ops.NewtonIters(p, relEps, n), re, ev)
			// The bound δ/(p(1−δ)) holds for δ < 1. Under TF32 the iterate's
			// 10-bit products leave δ above 1 for ill-conditioned inputs
			// (X^p·A amplifies the error in the small eigenvalues' directions)
			// while the root itself stays accurate (seen on an H100: relative
			// error 2.8e-4, δ 2.5): there only the error is asserted.
			if !(re <= prec.tol) || (dmax < 1 && !(re <= dmax/(p*(1-dmax))+prec.tol/4)) {
				t.Errorf("Newton: relative error %.3g, largest residual %.3g", re, dmax)
			}
			if prec.name == "f32" && !(dmax < 1) {
				t.Errorf("Newton in f32: residual %.3g, want < 1", dmax)
			}
		})
	}
}

// TestCUDAEighF64Agrees: the f32 and f64 eigensolvers give the same
// eigenvalues (to f32's accuracy) on a batch, and statuses 0.
func TestCUDAEighF64Agrees(t *testing.T) {
	d := gpu(t)
	a := device.Local{Dev: d}
	e := cudaEngine(t, d, ops.PrecF32)
	const batch, n = 3, 200
	s := wishart(t, e, a, rand.New(rand.NewPCG(3, 4)), batch, n)
	var ws [2][]float32
	for i, f64 := range []bool{false, true} {
		q := opstest.Empty(t, a, tensor.F32, batch, n, n)
		w := opstest.Empty(t, a, tensor.F32, batch, n)
		st := opstest.Empty(t, a, tensor.I32, batch)
		if err := e.Eigh(ops.Eigh{A: s, Q: q, W: w, F64: f64, Status: st}); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		b, _ := st.Read()
		if sv := tensor.BytesAs[int32](b); slices.Max(sv) != 0 {
			t.Errorf("f64 %v: statuses %v", f64, sv)
		}
		ws[i], _ = w.ReadFloat32()
	}
	for i := range ws[0] {
		if math.Abs(float64(ws[0][i]-ws[1][i])) > 1e-5*4 {
			t.Fatalf("eigenvalue %d: f32 %v, f64 %v", i, ws[0][i], ws[1][i])
		}
	}
}

// rootBench is one benchmarked inverse-root problem.
type rootBench struct {
	batch, n int
}

// BenchmarkInverseRoot times (A + rI)^(−1/4) of Wishart matrices — one of
// order 1024, one of 4096, a batch of 64 of order 512 — by the batched
// Newton iteration (TF32 tensor cores, the default iteration count for the
// ridge) and by eigendecomposition (cuSOLVER syevd, f32), with the ridge
// relative to ‖A‖_F of Shampoo's default (1e-6) and of 1e-4 (for the
// batch, eigendecomposition also one syevd per matrix, against cuSOLVER's
// batched solver). Each call
// between two CUDA events, waited for; the median over b.N calls as
// ms/call, and the relative error against the float64 eigendecomposition
// as rel_err. bench/reference/roots.py measures torch.linalg.eigh's route
// on the same problems.
func BenchmarkInverseRoot(b *testing.B) {
	cudatest.RequireGPU(b)
	d, err := device.NewCUDA(0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	a := device.Local{Dev: d}
	engines := map[string]*ops.Engine{}
	for _, p := range []struct {
		name string
		prec ops.Precision
	}{{"tf32", ops.PrecTF32}, {"f32", ops.PrecF32}, {"f32-loop", ops.PrecF32}} {
		e, err := ops.NewEngine(d, ops.Options{Precision: p.prec})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.Impl().(io.Closer).Close() })
		if p.name == "f32-loop" {
			ops.NoBatchedEigh(e)
		}
		engines[p.name] = e
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []rootBench{{1, 1024}, {1, 4096}, {64, 512}} {
		e := engines["tf32"]
		s := wishart(b, e, a, r, c.batch, c.n)
		shape := []int{c.batch, c.n, c.n}
		for _, relEps := range []float32{1e-6, 1e-4} {
			ref := opstest.Empty(b, a, tensor.F32, shape...)
			if err := e.InverseRoot(ops.InverseRoot{A: s, X: ref, P: 4, RelEps: relEps, Method: ops.RootEigen, F64: true}); err != nil {
				b.Fatal(err)
			}
			for _, m := range []struct {
				name   string
				method ops.RootMethod
				engine string
			}{{"newton-tf32", ops.RootNewton, "tf32"}, {"newton-f32", ops.RootNewton, "f32"}, {"eigen-f32", ops.RootEigen, "f32"},
				{"eigen-f32-syevd-loop", ops.RootEigen, "f32-loop"}} {
				if m.engine == "f32-loop" && c.batch == 1 {
					continue // the same call
				}
				name := fmt.Sprintf("batch=%d,n=%d/releps=%g/%s", c.batch, c.n, relEps, m.name)
				b.Run(name, func(b *testing.B) {
					cudatest.RequireGPU(b)
					e := engines[m.engine]
					x := opstest.Empty(b, a, tensor.F32, shape...)
					call := func() error {
						return e.InverseRoot(ops.InverseRoot{A: s, X: x, P: 4, RelEps: relEps, Method: m.method})
					}
					if err := errors.Join(call(), e.Sync()); err != nil { // compiles kernels, sizes scratch
						b.Fatal(err)
					}
					ev0, err1 := e.NewEvent(true)
					ev1, err2 := e.NewEvent(true)
					if err := errors.Join(err1, err2); err != nil {
						b.Fatal(err)
					}
					defer ev0.Close()
					defer ev1.Close()
					ms := make([]float64, 0, b.N)
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						err := errors.Join(ev0.Record(), call(), ev1.Record(), ev1.Wait())
						t, terr := ev1.Elapsed(ev0)
						if err := errors.Join(err, terr); err != nil {
							b.Fatal(err)
						}
						ms = append(ms, float64(t))
					}
					b.StopTimer()
					slices.Sort(ms)
					b.ReportMetric(ms[len(ms)/2], "ms/call")
					b.ReportMetric(rootRelErr(b, x, ref, c.batch, c.n), "rel_err")
					if m.method == ops.RootNewton {
						b.ReportMetric(float64(ops.NewtonIters(4, float64(relEps), c.n)), "iters")
					}
				})
			}
		}
	}
}
