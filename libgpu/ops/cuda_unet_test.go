package ops_test

// GPU tests and benchmarks of the U-Net op families (conv2d, groupnorm,
// chanbias, resample, concat, mse, diffusion) at the shapes of the
// diffusion U-Net (channels 64-128-256 at 32×32), where the registered
// family checks use small ones: every op on the GPU against the host
// backend on the same inputs (the host is the f32 reference), bitwise
// determinism of the reductions, and timings.

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// twin holds a GPU engine and a host engine and uploads the same values
// to both.
type twin struct {
	t      *testing.T
	g, h   *ops.Engine
	ga, ha device.Allocator
	r      *rand.Rand
}

func newTwin(t *testing.T, d *device.CUDA, prec ops.Precision) *twin {
	hd := device.NewHost()
	he, err := ops.NewEngine(hd, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return &twin{t: t, g: cudaEngine(t, d, prec), h: he, ga: device.Local{Dev: d}, ha: device.Local{Dev: hd}, r: rand.New(rand.NewPCG(seed, 5))}
}

// pair returns a GPU tensor and a host tensor of dtype dt holding the same
// N(0, scale²) draws (rounded to dt).
func (w *twin) pair(dt tensor.DType, scale float64, shape ...int) (*tensor.Tensor, *tensor.Tensor) {
	v := make([]float32, tensor.Numel(shape))
	for i := range v {
		v[i] = float32(scale * w.r.NormFloat64())
	}
	g, h := opstest.Empty(w.t, w.ga, dt, shape...), opstest.Empty(w.t, w.ha, dt, shape...)
	if err := g.WriteFloat32(v); err != nil {
		w.t.Fatal(err)
	}
	if err := h.WriteFloat32(v); err != nil {
		w.t.Fatal(err)
	}
	return g, h
}

func (w *twin) empty(dt tensor.DType, shape ...int) (*tensor.Tensor, *tensor.Tensor) {
	return opstest.Empty(w.t, w.ga, dt, shape...), opstest.Empty(w.t, w.ha, dt, shape...)
}

// near compares a GPU result with the host's: relative error ≤ tol.
func (w *twin) near(what string, g, h *tensor.Tensor, tol float64) {
	w.t.Helper()
	if err := w.g.Sync(); err != nil {
		w.t.Fatal(err)
	}
	gv, err := g.ReadFloat32()
	if err != nil {
		w.t.Fatal(err)
	}
	hv, err := h.ReadFloat32()
	if err != nil {
		w.t.Fatal(err)
	}
	if e := opstest.TermsErr(opstest.F64(gv), opstest.F64(hv), nil); !(e <= tol) {
		w.t.Errorf("%s: GPU vs host relative error %.3g > %.3g", what, e, tol)
	}
}

// TestCUDAUNetShapes runs the U-Net's ops at its real shapes (batch 4) on
// the GPU in f32 (PrecF32: full f32 GEMMs) and bf16, against the host
// backend on the same inputs: the vector paths, im2col chunking and the
// block geometry of the norms at sizes the family checks do not reach.
// bf16 runs every convolution path: the default (on sm_90a the wgmma
// forward, tuned per shape, and mma.sync gradients), wgmma throughout on
// sm_90a (forward and input-gradient tiles of 64, 128 and 256 channels,
// the last at 18 × 32² × 64 → 512; weight gradients split over the pixels
// and reduced) and im2col + cuBLASLt.
func TestCUDAUNetShapes(t *testing.T) {
	for _, c := range []struct {
		name string
		prec ops.Precision
		dt   tensor.DType
		tol  float64
		path int
	}{{"f32", ops.PrecF32, tensor.F32, 1e-4, ops.ConvIm2col}, {"bf16", ops.PrecBF16, tensor.BF16, 2e-2, ops.ConvMMA},
		{"bf16-wg", ops.PrecBF16, tensor.BF16, 2e-2, ops.ConvWG}, {"bf16-im2col", ops.PrecBF16, tensor.BF16, 2e-2, ops.ConvIm2col}} {
		t.Run(c.name, func(t *testing.T) {
			defer ops.SetConvPath(c.path)()
			w := newTwin(t, gpu(t), c.prec)
			// conv2d_wg.cu's and groupedgemm.cu's wgmma kernels exist under
			// the same rule (sm_90a), so bf16-wg on a Hopper GPU tests them
			// and not a fallback.
			if hc, hg := ops.ConvHopper(w.g), ops.GroupedHopper(w.g); hc != hg {
				t.Fatalf("conv_wg_fwd available %v, grouped GEMM's wgmma %v", hc, hg)
			} else {
				t.Logf("wgmma kernels: %v", hc)
			}
			for _, s := range []struct{ n, h, cin, cout, k int }{
				{4, 32, 64, 64, 3}, {4, 32, 192, 64, 3}, {4, 16, 384, 128, 3}, {4, 8, 256, 256, 3}, {4, 32, 1, 64, 3},
				{4, 16, 64, 128, 1}, {4, 8, 512, 256, 1}, {18, 32, 64, 512, 3},
			} {
				name := fmt.Sprintf("conv %dx%dx%dx%d→%d k%d", s.n, s.h, s.h, s.cin, s.cout, s.k)
				xg, xh := w.pair(c.dt, 1, s.n, s.h, s.h, s.cin)
				wg, wh := w.pair(c.dt, 1/math.Sqrt(float64(s.cin*s.k*s.k)), s.cout, s.k, s.k, s.cin)
				bg, bh := w.pair(c.dt, 1, s.cout)
				yg, yh := w.empty(c.dt, s.n, s.h, s.h, s.cout)
				p := ops.Conv2DParams{Stride: 1, Pad: s.k / 2}
				if err := w.g.Conv2D(yg, xg, wg, bg, p); err != nil {
					t.Fatal(err)
				}
				if err := w.h.Conv2D(yh, xh, wh, bh, p); err != nil {
					t.Fatal(err)
				}
				w.near(name+" y", yg, yh, c.tol)
				dyg, dyh := w.pair(c.dt, 1, s.n, s.h, s.h, s.cout)
				dxg, dxh := w.empty(c.dt, s.n, s.h, s.h, s.cin)
				dwg, dwh := w.empty(tensor.F32, s.cout, s.k, s.k, s.cin)
				dbg, dbh := w.empty(tensor.F32, s.cout)
				if err := w.g.Conv2DBackward(dxg, dwg, dbg, dyg, xg, wg, p, [3]bool{}); err != nil {
					t.Fatal(err)
				}
				if err := w.h.Conv2DBackward(dxh, dwh, dbh, dyh, xh, wh, p, [3]bool{}); err != nil {
					t.Fatal(err)
				}
				w.near(name+" dx", dxg, dxh, c.tol)
				w.near(name+" dw", dwg, dwh, c.tol)
				w.near(name+" db", dbg, dbh, 1e-4)
			}
			for _, s := range []struct{ n, hw, ch, g int }{{4, 1024, 64, 32}, {4, 1024, 192, 32}, {4, 256, 384, 32}, {4, 64, 512, 32}, {4, 64, 256, 32},
				// Split over positions (gn_stats, gn_norm): the video U-Net's
				// batch 2 at 64×64, and rows no chunk divides.
				{2, 4096, 640, 32}, {2, 1000, 320, 32}} {
				for _, silu := range []bool{false, true} {
					name := fmt.Sprintf("groupnorm %dx%dx%d/%d silu=%v", s.n, s.hw, s.ch, s.g, silu)
					xg, xh := w.pair(c.dt, 2, s.n, s.hw, s.ch)
					wg, wh := w.pair(tensor.F32, 1, s.ch)
					bg, bh := w.pair(tensor.F32, 1, s.ch)
					yg, yh := w.empty(c.dt, s.n, s.hw, s.ch)
					mg, mh := w.empty(tensor.F32, s.n, s.g)
					rg, rh := w.empty(tensor.F32, s.n, s.g)
					if err := w.g.GroupNorm(yg, mg, rg, xg, wg, bg, s.g, 1e-5, silu); err != nil {
						t.Fatal(err)
					}
					if err := w.h.GroupNorm(yh, mh, rh, xh, wh, bh, s.g, 1e-5, silu); err != nil {
						t.Fatal(err)
					}
					w.near(name+" y", yg, yh, max(c.tol, 1e-5))
					w.near(name+" rstd", rg, rh, 1e-5)
					dyg, dyh := w.pair(c.dt, 1, s.n, s.hw, s.ch)
					dxg, dxh := w.empty(c.dt, s.n, s.hw, s.ch)
					dwg, dwh := w.empty(tensor.F32, s.ch)
					dbg, dbh := w.empty(tensor.F32, s.ch)
					if err := w.g.GroupNormBackward(dxg, dwg, dbg, dyg, xg, wg, bg, mg, rg, s.g, silu, [3]bool{}); err != nil {
						t.Fatal(err)
					}
					if err := w.h.GroupNormBackward(dxh, dwh, dbh, dyh, xh, wh, bh, mh, rh, s.g, silu, [3]bool{}); err != nil {
						t.Fatal(err)
					}
					w.near(name+" dx", dxg, dxh, max(c.tol, 1e-4))
					w.near(name+" dw", dwg, dwh, 1e-4)
					w.near(name+" db", dbg, dbh, 1e-4)
				}
			}
			// The per-sample bias and its sum at batch 512 (a guided batch of
			// 256): one sum per (sample, channel) over 1024 positions.
			xg, xh := w.pair(c.dt, 1, 512, 1024, 64)
			bg, bh := w.pair(c.dt, 1, 512, 64)
			yg, yh := w.empty(c.dt, 512, 1024, 64)
			if err := w.g.AddChannels(yg, xg, bg); err != nil {
				t.Fatal(err)
			}
			if err := w.h.AddChannels(yh, xh, bh); err != nil {
				t.Fatal(err)
			}
			w.near("add channels", yg, yh, max(c.tol/2, 1e-6))
			sg, sh := w.empty(tensor.F32, 512, 64)
			if err := w.g.SpatialSum(sg, xg, false); err != nil {
				t.Fatal(err)
			}
			if err := w.h.SpatialSum(sh, xh, false); err != nil {
				t.Fatal(err)
			}
			w.near("spatial sum", sg, sh, 1e-5)
			// The conv bias gradient's shape: one sample of 512·1024 rows.
			x1g, x1h := w.pair(c.dt, 1, 1, 512*1024, 64)
			s1g, s1h := w.empty(tensor.F32, 1, 64)
			if err := w.g.SpatialSum(s1g, x1g, false); err != nil {
				t.Fatal(err)
			}
			if err := w.h.SpatialSum(s1h, x1h, false); err != nil {
				t.Fatal(err)
			}
			// f32 sums of 2¹⁹ terms in two orders differ by about √n·ε ≈ 4e-5.
			w.near("column sum of 524288 rows", s1g, s1h, 2e-4)
		})
	}
}

// TestCUDAUNetDeterminism: the reductions (groupnorm's backward, the conv
// weight gradient accumulated over im2col chunks, spatial sums, the MSE)
// give the same bits on a second run — what graph-versus-eager and
// resume checks of the trainer rely on.
func TestCUDAUNetDeterminism(t *testing.T) {
	w := newTwin(t, gpu(t), ops.PrecBF16)
	e := w.g
	x, _ := w.pair(tensor.BF16, 1, 200, 32, 32, 64) // several im2col chunks of 3×3×64 columns
	k, _ := w.pair(tensor.BF16, 0.05, 64, 3, 3, 64)
	dy, _ := w.pair(tensor.BF16, 1, 200, 32, 32, 64)
	gw, _ := w.pair(tensor.F32, 1, 64)
	gb, _ := w.pair(tensor.F32, 1, 64)
	mean, _ := w.empty(tensor.F32, 200, 32)
	rstd, _ := w.empty(tensor.F32, 200, 32)
	y, _ := w.empty(tensor.BF16, 200, 32, 32, 64)
	if err := e.GroupNorm(y, mean, rstd, x, gw, gb, 32, 1e-5, true); err != nil {
		t.Fatal(err)
	}
	run := func() [][]byte {
		dx, _ := w.empty(tensor.BF16, 200, 32, 32, 64)
		dwc, _ := w.empty(tensor.F32, 64, 3, 3, 64)
		dbc, _ := w.empty(tensor.F32, 64)
		dgw, _ := w.empty(tensor.F32, 64)
		dgb, _ := w.empty(tensor.F32, 64)
		loss, _ := w.empty(tensor.F32, 1)
		if err := e.Conv2DBackward(nil, dwc, dbc, dy, x, k, ops.Conv2DParams{Stride: 1, Pad: 1}, [3]bool{}); err != nil {
			t.Fatal(err)
		}
		if err := e.GroupNormBackward(dx, dgw, dgb, dy, x, gw, gb, mean, rstd, 32, true, [3]bool{}); err != nil {
			t.Fatal(err)
		}
		if err := e.MSELoss(loss, nil, x, dy, false); err != nil {
			t.Fatal(err)
		}
		var out [][]byte
		for _, t2 := range []*tensor.Tensor{dx, dwc, dbc, dgw, dgb, loss} {
			b, err := t2.Read()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
		}
		return out
	}
	a, b := run(), run()
	for i, name := range []string{"groupnorm dx", "conv dw", "conv db", "groupnorm dw", "groupnorm db", "mse"} {
		if !bytes.Equal(a[i], b[i]) {
			t.Errorf("%s differs between two runs", name)
		}
	}
}

// benchConv times Conv2D forward (and backward) at a U-Net shape in bf16
// and reports TFLOP/s of the useful 2·P·K·Cout products, on the kernel
// path (ops.ConvMMA; ops.ConvWG: wgmma on sm_90a, the default;
// ops.ConvIm2col).
func benchConv(b *testing.B, n, hw, cin, cout, k int, backward bool, path int) {
	defer ops.SetConvPath(path)()
	d := gpu(b)
	e := cudaEngine(b, d, ops.PrecBF16)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(1, 1))
	up := func(dt tensor.DType, shape ...int) *tensor.Tensor {
		t := opstest.Empty(b, a, dt, shape...)
		v := opstest.Rand(r, t.Numel())
		if err := t.WriteFloat32(v); err != nil {
			b.Fatal(err)
		}
		return t
	}
	x, w, bias := up(tensor.BF16, n, hw, hw, cin), up(tensor.BF16, cout, k, k, cin), up(tensor.BF16, cout)
	y := up(tensor.BF16, n, hw, hw, cout)
	dx, dw := up(tensor.BF16, n, hw, hw, cin), up(tensor.F32, cout, k, k, cin)
	p := ops.Conv2DParams{Stride: 1, Pad: k / 2}
	step := func() error {
		if backward {
			return e.Conv2DBackward(dx, dw, nil, y, x, w, p, [3]bool{})
		}
		return e.Conv2D(y, x, w, bias, p)
	}
	if err := step(); err != nil {
		b.Fatal(err)
	}
	ms := timeGPU(b, e, step)
	flops := 2 * float64(n*hw*hw) * float64(cin*k*k) * float64(cout)
	if backward {
		flops *= 2
	}
	b.ReportMetric(ms, "ms/op")
	b.ReportMetric(flops/ms/1e9, "TFLOP/s")
}

// timeGPU runs f b.N times between two timing events and returns the mean
// GPU milliseconds per call.
func timeGPU(b *testing.B, e *ops.Engine, f func() error) float64 {
	start, err := e.NewEvent(true)
	if err != nil {
		b.Fatal(err)
	}
	stop, err := e.NewEvent(true)
	if err != nil {
		b.Fatal(err)
	}
	defer start.Close()
	defer stop.Close()
	b.ResetTimer()
	if err := e.Do(func() error {
		if err := start.Record(); err != nil {
			return err
		}
		for i := 0; i < b.N; i++ {
			if err := f(); err != nil {
				return err
			}
		}
		return stop.Record()
	}); err != nil {
		b.Fatal(err)
	}
	if err := stop.Wait(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	ms, err := stop.Elapsed(start)
	if err != nil {
		b.Fatal(err)
	}
	return float64(ms) / float64(b.N)
}

// convPaths are the bf16 convolution kernel paths the tests and
// benchmarks compare: mma.sync, wgmma (cp.async-fed), wgmma
// warp-specialised (ws), wgmma warp-specialised with TMA loads (tma, the
// default: the forward and the input gradient; the weight gradient is
// wgmma's) and im2col + cuBLASLt.
var convPaths = []struct {
	name    string
	path    int
	ws, tma bool
}{{"mma", ops.ConvMMA, false, false}, {"wg", ops.ConvWG, false, false}, {"ws", ops.ConvWG, true, false},
	{"tma", ops.ConvWG, false, true}, {"im2col", ops.ConvIm2col, false, false}}

// TestCUDAConvTMAEqualsWG runs the default wgmma forward (conv2d_wg.cu) and
// then the TMA forward (conv2d_tma.cu) on the same inputs and asks for the
// same output, at shapes whose first TMA launch in a process faulted on a
// GPU machine before libgpu/cuda's encodeAligned pinned its buffer (issue
// 24: the tensor map came back zero). Both kernels take the same k-steps
// in the same order, so they agree to rounding.
func TestCUDAConvTMAEqualsWG(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecBF16)
	if !ops.ConvHopper(e) {
		t.Skip("no wgmma convolution on this GPU")
	}
	defer ops.SetConvTune(false)()
	defer ops.SetConvPath(ops.ConvWG)()
	a := device.Local{Dev: d}
	for i, s := range []struct{ n, hw, cin, cout int }{{16, 32, 64, 64}, {16, 32, 256, 256}, {4, 16, 64, 64}, {512, 8, 256, 256}} {
		seed := uint64(7 + i)
		t.Logf("seed %d: %d×%d²×%d→%d", seed, s.n, s.hw, s.cin, s.cout)
		r := rand.New(rand.NewPCG(seed, 1))
		up := func(shape ...int) *tensor.Tensor {
			x := opstest.Empty(t, a, tensor.BF16, shape...)
			if err := x.WriteFloat32(opstest.Rand(r, x.Numel())); err != nil {
				t.Fatal(err)
			}
			return x
		}
		x, w, bias := up(s.n, s.hw, s.hw, s.cin), up(s.cout, 3, 3, s.cin), up(s.cout)
		run := func(tma bool) []float32 {
			defer ops.SetConvTMA(tma)()
			y := up(s.n, s.hw, s.hw, s.cout) // poisoned by its random values
			if err := e.Conv2D(y, x, w, bias, ops.Conv2DParams{Stride: 1, Pad: 1}); err != nil {
				t.Fatalf("tma=%v: %v", tma, err)
			}
			v, err := y.ReadFloat32()
			if err != nil {
				t.Fatalf("tma=%v: %v", tma, err)
			}
			return v
		}
		want, got := run(false), run(true)
		var worst, scale float64
		for i := range want {
			worst = math.Max(worst, math.Abs(float64(got[i]-want[i])))
			scale = math.Max(scale, math.Abs(float64(want[i])))
		}
		if worst > 1e-2*scale {
			t.Errorf("%d×%d²×%d→%d: the TMA forward differs from the wgmma forward by %.3g (largest output %.3g)",
				s.n, s.hw, s.cin, s.cout, worst, scale)
		}
	}
}

// The U-Net's heaviest convolutions at a guided batch of 256 (512
// images), and issue 24's larger U-Net shapes (16×64²×320, 16×32²×640,
// 64×32²×256, 128×32²×128; 3×3, stride 1, Cin = Cout), each on the
// paths of convPaths; bench/conv.sh runs them beside PyTorch's cuDNN.
//
// GPUKIT_CONV_BENCH_SHAPES (comma-separated NxHWxCINxCOUT, e.g.
// 16x32x64x64) times those shapes instead.
func BenchmarkConv2D(b *testing.B) {
	shapes := []struct{ n, hw, cin, cout int }{
		{512, 32, 64, 64}, {512, 32, 192, 64}, {512, 16, 384, 128}, {512, 8, 256, 256},
		{16, 64, 320, 320}, {16, 32, 640, 640}, {64, 32, 256, 256}, {128, 32, 128, 128},
	}
	if v := os.Getenv("GPUKIT_CONV_BENCH_SHAPES"); v != "" {
		shapes = shapes[:0]
		for _, f := range strings.Split(v, ",") {
			var s struct{ n, hw, cin, cout int }
			if _, err := fmt.Sscanf(f, "%dx%dx%dx%d", &s.n, &s.hw, &s.cin, &s.cout); err != nil {
				b.Fatalf("GPUKIT_CONV_BENCH_SHAPES %q: %v (want NxHWxCINxCOUT)", f, err)
			}
			shapes = append(shapes, s)
		}
	}
	for _, s := range shapes {
		for _, p := range convPaths {
			for _, bwd := range []bool{false, true} {
				pass := "fwd"
				if bwd {
					pass = "bwd"
				}
				b.Run(fmt.Sprintf("%dx%dx%dx%dto%d/%s/%s", s.n, s.hw, s.hw, s.cin, s.cout, pass, p.name), func(b *testing.B) {
					defer ops.SetConvWS(p.ws)()
					defer ops.SetConvTMA(p.tma)()
					benchConv(b, s.n, s.hw, s.cin, s.cout, 3, bwd, p.path)
				})
			}
		}
	}
}

// BenchmarkGroupNormSiLU_512x32x32x64 times the fused norm + SiLU at the
// largest activation of a guided batch of 256, and reports the bandwidth
// of its one read and one write (it reads x three times; two from L2).
func BenchmarkGroupNormSiLU_512x32x32x64(b *testing.B) {
	d := gpu(b)
	e := cudaEngine(b, d, ops.PrecBF16)
	a := device.Local{Dev: d}
	x := opstest.Empty(b, a, tensor.BF16, 512, 1024, 64)
	if err := x.WriteFloat32(opstest.Rand(rand.New(rand.NewPCG(1, 2)), x.Numel())); err != nil {
		b.Fatal(err)
	}
	y := opstest.Empty(b, a, tensor.BF16, 512, 1024, 64)
	step := func() error { return e.GroupNorm(y, nil, nil, x, nil, nil, 32, 1e-5, true) }
	if err := step(); err != nil {
		b.Fatal(err)
	}
	ms := timeGPU(b, e, step)
	b.ReportMetric(ms, "ms/op")
	b.ReportMetric(float64(2*x.Bytes())/ms/1e6, "GB/s")
}

// TestCUDAConvKernelPaths runs the conv2d family's checks (float64
// references with their terms, the fused op, the two graphs, gradients by
// finite differences) on each bf16 kernel path with the fused kernels on:
// mma.sync and, on sm_90a, wgmma (forward, input and weight gradients),
// wgmma warp-specialised (ws: all three; not a default), ws with TMA
// loads (tma; not a default) and im2col + cuBLASLt (convPaths); every
// precision, as TestCUDAFamilies runs the default path.
// The per-shape timing (convtune.go) is off, so that each path runs its
// own kernels.
func TestCUDAConvKernelPaths(t *testing.T) {
	d := gpu(t)
	defer ops.SetConvFuseKernels(true)()
	defer ops.SetConvTune(false)()
	for _, path := range convPaths {
		for _, p := range precs {
			t.Run(path.name+"/"+p.name, func(t *testing.T) {
				cudatest.RequireGPU(t)
				defer ops.SetConvPath(path.path)()
				defer ops.SetConvWS(path.ws)()
				defer ops.SetConvTMA(path.tma)()
				opstest.CheckFamily(t, "conv2d", d, ops.Options{Precision: p.prec}, func(t *testing.T) { cudatest.RequireGPU(t) })
			})
		}
	}
}
