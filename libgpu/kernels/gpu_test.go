package kernels_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/kernels"
)

// Tests in this file need a GPU and NVRTC; cudatest.RequireGPU skips them on
// CI and fails them when GPUKIT_REQUIRE_GPU=1.

func devFloats[T float32 | float64](t *testing.T, host []T) cuda.DevicePtr {
	t.Helper()
	n := int64(len(host)) * int64(unsafe.Sizeof(host[0]))
	p, err := cuda.MemAlloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cuda.MemFree(p) })
	if err := cuda.MemcpyHtoD(p, unsafe.Pointer(&host[0]), n); err != nil {
		t.Fatal(err)
	}
	return p
}

func readFloats[T float32 | float64](t *testing.T, p cuda.DevicePtr, n int) []T {
	t.Helper()
	out := make([]T, n)
	if err := cuda.MemcpyDtoH(unsafe.Pointer(&out[0]), p, int64(n)*int64(unsafe.Sizeof(out[0]))); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestGPUBuildLoadLaunchAxpy(t *testing.T) {
	cudatest.RequireGPU(t)
	cache, err := kernels.OpenCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dc, err := kernels.NewDeviceCompiler(cudatest.Context(), cache)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	f, err := dc.Function("selftest.cu", "gpukit_axpy")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 2))
	n := 100_000 + r.IntN(10_000)
	a := float32(r.NormFloat64())
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], y[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
	}
	dx, dy := devFloats(t, x), devFloats(t, y)
	nn := uint64(n)
	if err := cuda.LaunchKernel(f, [3]uint32{120, 1, 1}, [3]uint32{256, 1, 1}, 0, 0,
		unsafe.Pointer(&a), unsafe.Pointer(&dx), unsafe.Pointer(&dy), unsafe.Pointer(&nn)); err != nil {
		t.Fatal(err)
	}
	got := readFloats[float32](t, dy, n)
	for i := range got {
		want := float64(a)*float64(x[i]) + float64(y[i])
		if d := math.Abs(float64(got[i]) - want); d > 1e-6*(1+math.Abs(want)) {
			t.Fatalf("y[%d] = %g, want %g", i, got[i], want)
		}
	}
	// Module is loaded once; a second compiler over the same cache hits it.
	m1, _ := dc.Module("selftest.cu")
	m2, _ := dc.Module("selftest.cu")
	if m1 != m2 {
		t.Fatal("module loaded twice")
	}
	src, _ := kernels.Embedded("selftest.cu")
	res, err := kernels.NewCompiler(kernels.NewNVRTC(), cache).Compile(src, kernels.EmbeddedOptions(dc.Arch()))
	if err != nil || !res.CacheHit {
		t.Fatalf("second compile: hit=%v err=%v", res.CacheHit, err)
	}
	// PTX for the same arch loads through the driver's JIT.
	ptx, err := kernels.NewCompiler(kernels.NewNVRTC(), nil).Compile(src, kernels.Options{Arch: dc.Arch(), PTX: true})
	if err != nil || !strings.Contains(string(ptx.PTX), ".entry gpukit_axpy") {
		t.Fatalf("PTX: %v", err)
	}
	pm, err := cuda.ModuleLoadData(ptx.PTX)
	if err != nil {
		t.Fatal(err)
	}
	pm.Unload()
}

func TestGPUNameExpressions(t *testing.T) {
	cudatest.RequireGPU(t)
	d, _ := cuda.GetDevice(0)
	ma, mi, err := d.ComputeCapability()
	if err != nil {
		t.Fatal(err)
	}
	src, _ := kernels.Embedded("selftest.cu")
	exprs := []string{"gpukit_scale<float>", "gpukit_scale<double>"}
	res, err := kernels.NewCompiler(kernels.NewNVRTC(), nil).Compile(src, kernels.Options{Arch: kernels.Arch(ma, mi), NameExprs: exprs})
	if err != nil {
		t.Fatal(err)
	}
	low := res.LoweredNames["gpukit_scale<double>"]
	if !strings.HasPrefix(low, "_Z") || low == res.LoweredNames["gpukit_scale<float>"] {
		t.Fatalf("lowered names %v", res.LoweredNames)
	}
	m, err := cuda.ModuleLoadData(res.Cubin)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	f, err := m.Function(low)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 3))
	n := 5000 + r.IntN(1000)
	x := make([]float64, n)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	s, nn := r.NormFloat64(), uint64(n)
	dx := devFloats(t, x)
	if err := cuda.LaunchKernel(f, [3]uint32{8, 1, 1}, [3]uint32{128, 1, 1}, 0, 0,
		unsafe.Pointer(&dx), unsafe.Pointer(&s), unsafe.Pointer(&nn)); err != nil {
		t.Fatal(err)
	}
	got := readFloats[float64](t, dx, n)
	for i := range got {
		if got[i] != x[i]*s {
			t.Fatalf("x[%d] = %g, want %g", i, got[i], x[i]*s)
		}
	}
}

func TestGPUCompileErrorFileLine(t *testing.T) {
	cudatest.RequireGPU(t)
	code := "extern \"C\" __global__ void k(float* x) {\n  float y = 1;\n  x[0] = undefined_thing + y;\n}\n"
	_, err := kernels.NewCompiler(kernels.NewNVRTC(), nil).Compile(
		kernels.Source{Name: "broken.cu", Code: []byte(code)}, kernels.Options{Arch: "sm_80"})
	var ce *kernels.CompileError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v, want a *CompileError", err)
	}
	if !strings.Contains(ce.Log, "broken.cu:3:10: error: identifier \"undefined_thing\" is undefined") {
		t.Fatalf("log does not name broken.cu:3:10:\n%s", ce.Log)
	}
}

// TestGPUInfoMatchesDriver compiles every embedded kernel source, reads the
// cubin's resource report, and checks it against what the driver reports.
func TestGPUInfoMatchesDriver(t *testing.T) {
	cudatest.RequireGPU(t)
	dc, err := kernels.NewDeviceCompiler(cudatest.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	checked := 0
	for _, name := range kernels.Sources() {
		src, _ := kernels.Embedded(name)
		res, err := dc.Compile(src, kernels.EmbeddedOptions(dc.Arch()))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		info, err := kernels.ParseCubin(res.Cubin)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if info.Arch != dc.Arch() {
			t.Errorf("%s: cubin arch %q, device arch %q", name, info.Arch, dc.Arch())
		}
		m, err := dc.Module(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, k := range info.Kernels {
			f, err := m.Function(k.Name)
			if err != nil {
				t.Fatalf("%s: %s: %v", name, k.Name, err)
			}
			attr := func(a cuda.FunctionAttribute) int {
				v, err := f.Attribute(a)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			if regs := attr(cuda.FuncNumRegs); regs != k.Registers {
				t.Errorf("%s %s: registers %d, driver %d", name, k.Name, k.Registers, regs)
			}
			if sh := attr(cuda.FuncSharedSizeBytes); int64(sh) != k.SharedBytes {
				t.Errorf("%s %s: shared %d, driver %d", name, k.Name, k.SharedBytes, sh)
			}
			if lo := attr(cuda.FuncLocalSizeBytes); int64(lo) != k.LocalBytes {
				t.Errorf("%s %s: local %d, driver %d", name, k.Name, k.LocalBytes, lo)
			}
			if mt := attr(cuda.FuncMaxThreadsPerBlock); k.MaxThreads > 0 && mt > k.MaxThreads {
				t.Errorf("%s %s: launch bound %d, driver allows %d", name, k.Name, k.MaxThreads, mt)
			}
			checked++
		}
	}
	if checked < 2 {
		t.Fatalf("only %d kernels checked", checked)
	}
}

// TestGPUPrefetchInstances: a Splittable file compiles one kernel at a time
// through the DeviceCompiler's worker pool into an empty cache: the
// kernels asked for load, each from its own small image (NVRTC generates
// no other kernel's code), the whole file is never compiled, and the
// sm_90a probe (attn_wg_unavailable) answers as the whole file would.
func TestGPUPrefetchInstances(t *testing.T) {
	cudatest.RequireGPU(t)
	cache, err := kernels.OpenCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dc, err := kernels.NewDeviceCompiler(cudatest.Context(), cache)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	attn := []string{"attn_fwd_tc_drop_d64", "attn_bwd_dq_tc_drop_d64", "attn_bwd_dkdv_tc_drop_d64", "attn_bwd_delta_v_bf16"}
	ln := []string{"ln_addf_v4n3_bf16", "ln_bwdf_v4n3_bf16"}
	dc.Prefetch("attention.cu", attn...)
	dc.Prefetch("layernorm.cu", ln...)
	for _, k := range attn {
		if !dc.Prefetched("attention.cu", k) {
			t.Errorf("%s not queued by Prefetch", k)
		}
		if _, err := dc.Function("attention.cu", k); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range ln {
		if _, err := dc.Function("layernorm.cu", k); err != nil {
			t.Fatal(err)
		}
	}
	if dc.Prefetched("attention.cu", "attn_fwd_simt_f32") {
		t.Error("a kernel nobody asked for counts as prefetched")
	}
	st, err := cache.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != len(attn)+len(ln) {
		t.Errorf("%d cache entries, want one per kernel (%d)", st.Entries, len(attn)+len(ln))
	}
	whole, _ := kernels.Embedded("attention.cu")
	if ok, _ := dc.Cached(whole, kernels.EmbeddedOptions(dc.Arch())); ok {
		t.Error("the whole attention.cu was compiled")
	}
	// One kernel's image: the file's other kernels are there, empty (a
	// few registers, no shared memory), so NVRTC generated no code for
	// them.
	one, err := dc.Compile(whole, kernels.Options{Arch: dc.Arch(), Defines: []string{"GPUKIT_ONLY=attn_bwd_dkdv_tc_d64"}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := kernels.ParseCubin(one.Cubin)
	if err != nil {
		t.Fatal(err)
	}
	var kept kernels.KernelInfo
	for _, k := range info.Kernels {
		if k.Name == "attn_bwd_dkdv_tc_d64" {
			kept = k
		}
	}
	t.Logf("attn_bwd_dkdv_tc_d64 alone: %d bytes, %d kernels; it uses %d registers", len(one.Cubin), len(info.Kernels), kept.Registers)
	if kept.Registers < 32 || len(info.Kernels) < 30 {
		t.Fatalf("kept kernel %+v among %d", kept, len(info.Kernels))
	}
	for _, k := range info.Kernels {
		if k.Name != kept.Name && (2*k.Registers > kept.Registers || k.SharedBytes > 0) {
			t.Errorf("%s, not kept, has %d registers and %d bytes of shared memory: it was compiled", k.Name, k.Registers, k.SharedBytes)
		}
	}
	unavailable, err := dc.Has("attention.cu", "attn_wg_unavailable")
	if err != nil {
		t.Fatal(err)
	}
	if unavailable != (dc.Arch() != "sm_90a") {
		t.Errorf("attn_wg_unavailable present = %v on %s", unavailable, dc.Arch())
	}
}
