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

// SkewCounts splits t rows over e groups with sizes ∝ exp(a·i/(e−1)), a
// chosen by bisection so that the busiest group holds ratio × the mean
// (ratio 1: balanced); the rounding remainder goes to the last groups.
// bench/reference/grouped_mm.py computes the same counts.
func SkewCounts(e, t int, ratio float64) []int {
	w := func(a float64) []float64 {
		v := make([]float64, e)
		for i := range v {
			v[i] = math.Exp(a * float64(i) / float64(max(e-1, 1)))
		}
		return v
	}
	peak := func(a float64) float64 {
		v := w(a)
		var s float64
		for _, x := range v {
			s += x
		}
		return float64(e) * v[e-1] / s
	}
	lo, hi := 0.0, 50.0
	for i := 0; i < 200; i++ {
		mid := (lo + hi) / 2
		if peak(mid) < ratio {
			lo = mid
		} else {
			hi = mid
		}
	}
	v := w(lo)
	var s float64
	for _, x := range v {
		s += x
	}
	counts := make([]int, e)
	used := 0
	for i := range counts {
		counts[i] = int(math.Floor(float64(t) * v[i] / s))
		used += counts[i]
	}
	for i := e - 1; used < t; i = (i + e - 1) % e {
		counts[i]++
		used++
	}
	return counts
}

func offsetsOf(counts []int) []int32 {
	off := make([]int32, len(counts)+1)
	for i, c := range counts {
		off[i+1] = off[i] + int32(c)
	}
	return off
}

// groupedPaths are the bf16 kernel families of the grouped GEMM.
var groupedPaths = []struct {
	name string
	path int
}{{"wgmma-128x256", ops.GroupedDefault}, {"wgmma-128x128", ops.GroupedWG128}, {"cuda-cores", ops.GroupedSIMT}}

// TestCUDAGroupedGEMMLarge: the grouped GEMM's three products at MoE sizes
// (8 experts, 2304 rows in balanced, skewed (busiest 1.64× the mean) and
// empty-group layouts, 768 → 3072 and back; and 64 experts skewed 3.72×,
// 768 → 512), on every kernel family (wgmma with both tile widths, CUDA
// cores), bf16 operands into bf16 and f32 outputs, outputs NaN-poisoned
// first, against float64 sums at 3000 sampled elements of each output
// (relative to the norm of the terms' magnitudes: 1e-2 for bf16 outputs,
// 1e-5 for f32); empty groups' dW must be exactly 0; and on sm_90a the
// wgmma families must be the ones running.
func TestCUDAGroupedGEMMLarge(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	if !ops.GroupedHopper(e) {
		t.Log("not sm_90a: the wgmma families fall back to CUDA cores")
	}
	a := device.Local{Dev: d}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 31))
	cases := []struct {
		name       string
		counts     []int
		n, k       int
		withZeroes bool
	}{
		{"E8/balanced/768-3072", SkewCounts(8, 2304, 1), 3072, 768, false},
		{"E8/skewed1.64/768-3072", SkewCounts(8, 2304, 1.64), 3072, 768, false},
		{"E8/empty/3072-768", []int{0, 700, 0, 1, 900, 0, 703, 0}, 768, 3072, true},
		{"E64/skewed3.72/768-512", SkewCounts(64, 4096, 3.72), 512, 768, false},
	}
	for _, c := range cases {
		g := opstest.GroupedGeom{E: len(c.counts), N: c.n, K: c.k, Off: offsetsOf(c.counts)}
		g.T = int(g.Off[g.E])
		x, xv := randBF16(t, a, r, g.T, g.K)
		w, wv := randBF16(t, a, r, g.E, g.N, g.K)
		dy, dyv := randBF16(t, a, r, g.T, g.N)
		off := opstest.UploadI32(t, a, g.Off, g.E+1)
		for _, p := range groupedPaths {
			for _, out := range []tensor.DType{tensor.BF16, tensor.F32} {
				t.Run(fmt.Sprintf("%s/%s/out=%v", c.name, p.name, out), func(t *testing.T) {
					defer ops.SetGroupedPath(p.path)()
					y, dx, dw := opstest.Empty(t, a, out, g.T, g.N), opstest.Empty(t, a, out, g.T, g.K), opstest.Empty(t, a, out, g.E, g.N, g.K)
					if err := errors.Join(e.GroupedMatmul(y, x, w, nil, off, false),
						e.GroupedMatmulBackward(dx, dw, nil, dy, x, w, off, [3]bool{})); err != nil {
						t.Fatal(err)
					}
					if err := e.Sync(); err != nil {
						t.Fatal(err)
					}
					tol := 1e-2
					if out == tensor.F32 {
						tol = 1e-5
					}
					yv, dxv, dwv := readF64(t, y), readF64(t, dx), readF64(t, dw)
					sampleCheck(t, "y", r, g.T*g.N, tol, func(i int) (float64, float64, float64) {
						row, n := i/g.N, i%g.N
						grp := groupOf(g.Off, row)
						s, m := dot(g.K, func(k int) (float64, float64) { return xv[row*g.K+k], wv[(grp*g.N+n)*g.K+k] })
						return yv[i], s, m
					})
					sampleCheck(t, "dx", r, g.T*g.K, tol, func(i int) (float64, float64, float64) {
						row, k := i/g.K, i%g.K
						grp := groupOf(g.Off, row)
						s, m := dot(g.N, func(n int) (float64, float64) { return dyv[row*g.N+n], wv[(grp*g.N+n)*g.K+k] })
						return dxv[i], s, m
					})
					sampleCheck(t, "dw", r, g.E*g.N*g.K, tol, func(i int) (float64, float64, float64) {
						grp, n, k := i/(g.N*g.K), i/g.K%g.N, i%g.K
						r0 := int(g.Off[grp])
						s, m := dot(int(g.Off[grp+1])-r0, func(j int) (float64, float64) { return dyv[(r0+j)*g.N+n], xv[(r0+j)*g.K+k] })
						return dwv[i], s, m
					})
					if c.withZeroes {
						for grp := range c.counts {
							if c.counts[grp] == 0 && slices.ContainsFunc(dwv[grp*g.N*g.K:(grp+1)*g.N*g.K], func(v float64) bool { return v != 0 }) {
								t.Errorf("dw of empty group %d is not all zero", grp)
							}
						}
					}
				})
			}
		}
	}
}

func readF64(t *testing.T, x *tensor.Tensor) []float64 {
	v, err := x.ReadFloat32()
	if err != nil {
		t.Fatal(err)
	}
	return opstest.F64(v)
}

// randBF16 uploads N(0, 1) draws rounded to bf16 and returns them.
func randBF16(t *testing.T, a device.Allocator, r *rand.Rand, shape ...int) (*tensor.Tensor, []float64) {
	v := make([]float32, tensor.Numel(shape))
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	x := opstest.Empty(t, a, tensor.BF16, shape...)
	if err := x.WriteFloat32(v); err != nil {
		t.Fatal(err)
	}
	back, err := x.ReadFloat32()
	if err != nil {
		t.Fatal(err)
	}
	return x, opstest.F64(back)
}

func groupOf(off []int32, row int) int {
	g, _ := slices.BinarySearch(off, int32(row)+1)
	return g - 1
}

func dot(n int, term func(i int) (float64, float64)) (s, m float64) {
	for i := 0; i < n; i++ {
		a, b := term(i)
		s += a * b
		m += math.Abs(a * b)
	}
	return s, m
}

// sampleCheck compares got with the float64 sum at 3000 random elements:
// opstest.TermsErr over the sample, mag each element's terms' size.
func sampleCheck(t *testing.T, what string, r *rand.Rand, n int, tol float64, at func(i int) (got, want, mag float64)) {
	t.Helper()
	var g, w, mag []float64
	for j := 0; j < 3000; j++ {
		gv, wv, m := at(r.IntN(n))
		g, w, mag = append(g, gv), append(w, wv), append(mag, m)
	}
	if e := opstest.TermsErr(g, w, mag); !(e <= tol) {
		t.Errorf("%s: relative error %.3g > %.3g at 3000 sampled elements", what, e, tol)
	}
}

// TestCUDAGroupedGEMMGraph: grouped products captured in a CUDA graph
// follow the offsets on the device: after the offsets change (written
// between replays, no recapture), a replay gives the new grouping's result,
// equal bitwise to an eager run with the new offsets.
func TestCUDAGroupedGEMMGraph(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(5, 6))
	const E, T, N, K = 8, 1000, 256, 384
	x, _ := randBF16(t, a, r, T, K)
	w, _ := randBF16(t, a, r, E, N, K)
	off := opstest.UploadI32(t, a, offsetsOf(SkewCounts(E, T, 1)), E+1)
	y := opstest.Empty(t, a, tensor.BF16, T, N)
	run := func() error { return e.GroupedMatmul(y, x, w, nil, off, false) }
	if err := run(); err != nil {
		t.Fatal(err)
	}
	gr, err := e.Capture(run)
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Close()
	skew := offsetsOf(SkewCounts(E, T, 3))
	if err := off.Write(tensor.AsBytes(skew)); err != nil {
		t.Fatal(err)
	}
	if err := gr.Launch(); err != nil {
		t.Fatal(err)
	}
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	replayed, err := y.Read()
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(opstest.Poison(y), run(), e.Sync()); err != nil {
		t.Fatal(err)
	}
	eager, err := y.Read()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(replayed, eager) {
		t.Fatal("the replayed graph's output differs from an eager run with the new offsets")
	}
}

// groupedBenchShapes are the grouped GEMM benchmarks (bf16, the
// forward product y = x·w[g]ᵀ): torch._grouped_mm on an H100 (2026-11-27)
// reached 624 TFLOP/s balanced and 604 skewed (busiest 1.64× the mean) at
// 8 experts × 4096 tokens, 768 → 3072, and 449 at 64 experts skewed 3.72×,
// 65536 × 768 → 512. bench/reference/grouped_mm.py times PyTorch at the
// same shapes and counts (SkewCounts).
var groupedBenchShapes = []struct {
	name       string
	e, t, n, k int
	ratio      float64
}{
	{"E8,T32768,768-3072,balanced", 8, 32768, 3072, 768, 1},
	{"E8,T32768,768-3072,skewed1.64", 8, 32768, 3072, 768, 1.64},
	{"E64,T65536,768-512,skewed3.72", 64, 65536, 512, 768, 3.72},
}

// BenchmarkGroupedGEMM times the grouped GEMM in bf16 (f32 accumulation,
// bf16 outputs) at groupedBenchShapes on each wgmma tile width: the
// forward, and the two backward products (dx = dy·w[g], dw[g] = dyᵀ·x),
// each call between two CUDA events and waited for, the median over b.N
// calls, reported as ms/call and TFLOP/s (2·T·N·K per product).
func BenchmarkGroupedGEMM(b *testing.B) {
	cudatest.RequireGPU(b)
	d, err := device.NewCUDA(0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	e, err := ops.NewEngine(d, ops.Options{Precision: ops.PrecTF32})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	ev0, err := e.NewEvent(true)
	if err != nil {
		b.Fatal(err)
	}
	ev1, err := e.NewEvent(true)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ev0.Close(); ev1.Close() })
	if !ops.GroupedHopper(e) {
		b.Log("not sm_90a: the grouped GEMM runs on CUDA cores")
	}
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range groupedBenchShapes {
		counts := SkewCounts(s.e, s.t, s.ratio)
		off := opstest.UploadI32(b, a, offsetsOf(counts), s.e+1)
		b.Logf("%s: busiest group %d rows, %.3f× the mean", s.name, slices.Max(counts), float64(slices.Max(counts))*float64(s.e)/float64(s.t))
		x := benchBF16(b, a, r, s.t, s.k)
		w := benchBF16(b, a, r, s.e, s.n, s.k)
		dy := benchBF16(b, a, r, s.t, s.n)
		y, dx, dw := opstest.Empty(b, a, tensor.BF16, s.t, s.n), opstest.Empty(b, a, tensor.BF16, s.t, s.k), opstest.Empty(b, a, tensor.BF16, s.e, s.n, s.k)
		passes := []struct {
			name string
			f    func() error
		}{
			{"fwd", func() error { return e.GroupedMatmul(y, x, w, nil, off, false) }},
			{"dx", func() error { return e.GroupedMatmulBackward(dx, nil, nil, dy, x, w, off, [3]bool{}) }},
			{"dw", func() error { return e.GroupedMatmulBackward(nil, dw, nil, dy, x, w, off, [3]bool{}) }},
		}
		flops := 2 * float64(s.t) * float64(s.n) * float64(s.k)
		type run struct {
			path string
			mode int
			pass int
		}
		var runs []run
		for _, p := range groupedPaths[:2] {
			for i := range passes {
				runs = append(runs, run{p.name, p.path, i})
			}
		}
		// What bounds the forward: its loads alone, its wgmma alone, and
		// everything but the epilogue's stores (results wrong).
		for _, p := range []struct {
			name string
			mode int
		}{{"probe-loads-only", ops.GroupedProbeLoads}, {"probe-mma-only", ops.GroupedProbeMMA}, {"probe-no-stores", ops.GroupedProbeNoStore}} {
			runs = append(runs, run{p.name, p.mode, 0})
		}
		for _, rn := range runs {
			p, pass := groupedPaths[0], passes[rn.pass]
			p.name, p.path = rn.path, rn.mode
			b.Run(fmt.Sprintf("%s/%s/%s", p.name, pass.name, s.name), func(b *testing.B) {
				defer ops.SetGroupedPath(p.path)()
				for i := 0; i < 3; i++ {
					if err := pass.f(); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.Sync(); err != nil {
					b.Fatal(err)
				}
				ms := make([]float64, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					err := errors.Join(ev0.Record(), pass.f(), ev1.Record(), ev1.Wait())
					el, terr := ev1.Elapsed(ev0)
					if err := errors.Join(err, terr); err != nil {
						b.Fatal(err)
					}
					ms = append(ms, float64(el))
				}
				b.StopTimer()
				slices.Sort(ms)
				med := ms[len(ms)/2]
				b.ReportMetric(med, "ms/call")
				b.ReportMetric(flops/(med*1e-3)/1e12, "TFLOP/s")
			})
		}
	}
}

func benchBF16(b *testing.B, a device.Allocator, r *rand.Rand, shape ...int) *tensor.Tensor {
	v := make([]float32, tensor.Numel(shape))
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	x := opstest.Empty(b, a, tensor.BF16, shape...)
	if err := x.WriteFloat32(v); err != nil {
		b.Fatal(err)
	}
	return x
}

// TestSkewCounts (host): SkewCounts splits every row, and its busiest
// group holds the asked multiple of the mean (to a row's rounding).
func TestSkewCounts(t *testing.T) {
	for _, c := range []struct {
		e, t  int
		ratio float64
	}{{8, 32768, 1}, {8, 32768, 1.64}, {64, 65536, 3.72}, {3, 10, 1.5}} {
		counts := SkewCounts(c.e, c.t, c.ratio)
		sum := 0
		for _, n := range counts {
			sum += n
		}
		got := float64(slices.Max(counts)) * float64(c.e) / float64(c.t)
		if sum != c.t || math.Abs(got-c.ratio) > float64(c.e)/float64(c.t)+1e-9 {
			t.Errorf("SkewCounts(%d, %d, %v) = %v: sum %d, busiest %.4f× the mean", c.e, c.t, c.ratio, counts, sum, got)
		}
	}
}
