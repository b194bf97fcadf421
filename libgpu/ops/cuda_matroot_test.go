package ops_test

import (
	"errors"
	"fmt"
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
		e := opstest.TermsErr(opstest.F64(xv[b*n*n:(b+1)*n*n]), opstest.F64(rv[b*n*n:(b+1)*n*n]), nil)
		worst = math.Max(worst, e)
	}
	return worst
}

// TestCUDAInverseRootLarge: on matrices of the sizes Shampoo meets (a
// batch of 4 of order 512, Wishart statistics), the float64
// eigendecomposition is the reference; the f32 one and the Newton
// iteration match it, Newton within its stated bound δ/(p(1−δ)) for the
// residual δ it reports (slack for TF32 rounding), every matrix accepted
// (Status 0): with full f32 products at ridge 1e-4·‖A‖_F, and with TF32
// products at ridge ops.NewtonTF32MinRelEps·‖A‖_F, the smallest at which
// the engine's TF32 is used. (TestCUDANewtonTF32 measures TF32 below it.)
func TestCUDAInverseRootLarge(t *testing.T) {
	d := gpu(t)
	a := device.Local{Dev: d}
	const batch, n, p = 4, 512, 4
	for _, prec := range []struct {
		name   string
		p      ops.Precision
		tol    float64
		relEps float32
	}{{"f32", ops.PrecF32, 2e-3, 1e-4}, {"tf32", ops.PrecTF32, 2e-2, ops.NewtonTF32MinRelEps}} {
		relEps := prec.relEps
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
			st := opstest.Empty(t, a, tensor.I32, batch)
			must("newton", e.InverseRoot(ops.InverseRoot{A: s, X: x, P: p, RelEps: relEps, Method: ops.RootNewton, Err: errT, Status: st}))
			must("sync", e.Sync())
			ev, _ := errT.ReadFloat32()
			re := rootRelErr(t, x, ref, batch, n)
			dmax := float64(slices.Max(ev))
			t.Logf("Newton (%d iterations): relative error %.3g, residuals δ %v", ops.NewtonIters(p, float64(relEps), n), re, ev)
			if sb, _ := st.Read(); slices.Max(tensor.BytesAs[int32](sb)) != 0 {
				t.Errorf("Newton: statuses %v, want all 0", tensor.BytesAs[int32](sb))
			}
			// The bound δ/(p(1−δ)) holds for δ < 1, which both cases must
			// reach: f32 products, and TF32 from NewtonTF32MinRelEps. (Below
			// it TF32 left δ above 1 — an H100 at ridge 1e-4: relative error
			// 2.8e-4, δ 2.5 — and that is why the products are f32 there.)
			if !(dmax < 1) || !(re <= dmax/(p*(1-dmax))+prec.tol/4) || !(re <= prec.tol) {
				t.Errorf("Newton: relative error %.3g, largest residual %.3g (bound %.3g)", re, dmax, dmax/(p*(1-dmax)))
			}
		})
	}
}

// TestCUDANewtonTF32 measures the Newton iteration on Shampoo's first
// statistics — GᵀG/k of Gaussian k×n blocks, k = n/2 (rank-deficient),
// batches of 4 — at orders 64, 256 and 1024 and ridges 1e-6, 1e-4 and
// ops.NewtonTF32MinRelEps (2e-3) times ‖A‖_F, on a TF32 engine, against
// the float64 eigendecomposition: with the default products (full f32
// below NewtonTF32MinRelEps, TF32 from it) every root must be accepted
// (Status 0) and accurate to 1e-2; with TF32 forced the error, the
// residual and the statuses are logged, not judged — the measurement that
// NewtonTF32MinRelEps (set from an emulation) should be checked against.
func TestCUDANewtonTF32(t *testing.T) {
	d := gpu(t)
	a := device.Local{Dev: d}
	e := cudaEngine(t, d, ops.PrecTF32)
	const batch, p = 4, 4
	for _, n := range []int{64, 256, 1024} {
		k := n / 2
		r := rand.New(rand.NewPCG(uint64(n), 9))
		g := make([]float32, batch*k*n)
		for i := range g {
			g[i] = float32(r.NormFloat64())
		}
		gt := opstest.Upload(t, a, g, batch, k, n)
		s := opstest.Empty(t, a, tensor.F32, batch, n, n)
		if err := e.Matmul(ops.Matmul{A: gt, B: gt, D: s, TransA: true, Alpha: 1 / float32(k), FullF32: true}); err != nil {
			t.Fatal(err)
		}
		for _, relEps := range []float32{1e-6, 1e-4, ops.NewtonTF32MinRelEps} {
			ref := opstest.Empty(t, a, tensor.F32, batch, n, n)
			if err := e.InverseRoot(ops.InverseRoot{A: s, X: ref, P: p, RelEps: relEps, Method: ops.RootEigen, F64: true}); err != nil {
				t.Fatal(err)
			}
			for _, mode := range []ops.RootTF32{ops.RootTF32Auto, ops.RootTF32On} {
				name := fmt.Sprintf("n=%d/releps=%g/%s", n, relEps, map[ops.RootTF32]string{ops.RootTF32Auto: "auto", ops.RootTF32On: "tf32"}[mode])
				t.Run(name, func(t *testing.T) {
					cudatest.RequireGPU(t)
					x := opstest.Empty(t, a, tensor.F32, batch, n, n)
					errT := opstest.Empty(t, a, tensor.F32, batch)
					st := opstest.Empty(t, a, tensor.I32, batch)
					if err := errors.Join(e.InverseRoot(ops.InverseRoot{A: s, X: x, P: p, RelEps: relEps, Method: ops.RootNewton,
						TF32: mode, Err: errT, Status: st}), e.Sync()); err != nil {
						t.Fatal(err)
					}
					ev, _ := errT.ReadFloat32()
					sb, _ := st.Read()
					sv := tensor.BytesAs[int32](sb)
					re := rootRelErr(t, x, ref, batch, n)
					t.Logf("relative error %.3g, δ %v, statuses %v", re, ev, sv)
					if mode == ops.RootTF32Auto && (slices.Max(sv) != 0 || !(re <= 1e-2)) {
						t.Errorf("default products: relative error %.3g, statuses %v", re, sv)
					}
				})
			}
		}
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
// Newton iteration (the default iteration count for the ridge) and by
// eigendecomposition (cuSOLVER syevd, f32), with the ridge relative to
// ‖A‖_F of Shampoo's default (1e-6), of 1e-4 and of
// ops.NewtonTF32MinRelEps (2e-3, the smallest at which Newton's products
// run in TF32 by default). Newton runs as an optimizer gets it on a TF32
// engine (newton-auto: full f32 products below 2e-3, TF32 from it), with
// TF32 products forced (newton-tf32: the instability below 2e-3,
// measured) and on an f32 engine (newton-f32); for the batch,
// eigendecomposition also one syevd per matrix, against cuSOLVER's batched
// solver. Each call between two CUDA events, waited for; the median over
// b.N calls as ms/call (the root alone: no residual, which Shampoo adds —
// a few f32 products); then one call with the residual: rel_err, the
// relative error against the float64 eigendecomposition (largest over the
// batch), resid (the largest residual δ) and failed (matrices rejected:
// not below ops.ResidualAccept). bench/reference/roots.py measures
// torch.linalg.eigh's route on the same problems.
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
		b.Cleanup(func() { e.Close() })
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
		for _, relEps := range []float32{1e-6, 1e-4, ops.NewtonTF32MinRelEps} {
			ref := opstest.Empty(b, a, tensor.F32, shape...)
			if err := e.InverseRoot(ops.InverseRoot{A: s, X: ref, P: 4, RelEps: relEps, Method: ops.RootEigen, F64: true}); err != nil {
				b.Fatal(err)
			}
			for _, m := range []struct {
				name   string
				method ops.RootMethod
				engine string
				tf32   ops.RootTF32
			}{{"newton-auto", ops.RootNewton, "tf32", ops.RootTF32Auto}, {"newton-tf32", ops.RootNewton, "tf32", ops.RootTF32On},
				{"newton-f32", ops.RootNewton, "f32", ops.RootTF32Auto}, {"eigen-f32", ops.RootEigen, "f32", ops.RootTF32Auto},
				{"eigen-f32-syevd-loop", ops.RootEigen, "f32-loop", ops.RootTF32Auto}} {
				if m.name == "newton-tf32" && relEps >= ops.NewtonTF32MinRelEps {
					continue // newton-auto runs TF32 there
				}
				if m.engine == "f32-loop" && c.batch == 1 {
					continue // the same call
				}
				name := fmt.Sprintf("batch=%d,n=%d/releps=%g/%s", c.batch, c.n, relEps, m.name)
				b.Run(name, func(b *testing.B) {
					cudatest.RequireGPU(b)
					e := engines[m.engine]
					x := opstest.Empty(b, a, tensor.F32, shape...)
					call := func() error {
						return e.InverseRoot(ops.InverseRoot{A: s, X: x, P: 4, RelEps: relEps, Method: m.method, TF32: m.tf32})
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
					// The residual and the statuses, as Shampoo asks for them.
					errT := opstest.Empty(b, a, tensor.F32, c.batch)
					st := opstest.Empty(b, a, tensor.I32, c.batch)
					if err := errors.Join(e.InverseRoot(ops.InverseRoot{A: s, X: x, P: 4, RelEps: relEps, Method: m.method, TF32: m.tf32,
						Err: errT, Status: st}), e.Sync()); err != nil {
						b.Fatal(err)
					}
					ev, _ := errT.ReadFloat32()
					sb, _ := st.Read()
					failed := 0
					for _, v := range tensor.BytesAs[int32](sb) {
						failed += int(min(v, 1))
					}
					b.ReportMetric(rootRelErr(b, x, ref, c.batch, c.n), "rel_err")
					b.ReportMetric(float64(slices.Max(ev)), "resid")
					b.ReportMetric(float64(failed), "failed")
					if m.method == ops.RootNewton {
						b.ReportMetric(float64(ops.NewtonIters(4, float64(relEps), c.n)), "iters")
					}
				})
			}
		}
	}
}
