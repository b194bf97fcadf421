package cuda_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
)

// archOption returns NVRTC's --gpu-architecture for device 0: sm_XXa from
// Hopper on (arch-specific features; not forward-compatible), sm_XX before.
func archOption(t testing.TB, virtual bool) (string, int) {
	t.Helper()
	d, err := cuda.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	major, minor, err := d.ComputeCapability()
	if err != nil {
		t.Fatal(err)
	}
	sm := 10*major + minor
	archs, err := cuda.SupportedArchs()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range archs {
		found = found || a == sm
	}
	if !found {
		t.Fatalf("NVRTC supports %v, not the device's sm_%d", archs, sm)
	}
	suffix := ""
	if major >= 9 {
		suffix = "a"
	}
	if virtual {
		return fmt.Sprintf("--gpu-architecture=compute_%d%s", sm, suffix), sm
	}
	return fmt.Sprintf("--gpu-architecture=sm_%d%s", sm, suffix), sm
}

// build compiles src to a cubin for device 0 and loads it; exprs are name
// expressions whose lowered names are returned in order.
func build(t testing.TB, src, name string, headers map[string]string, exprs ...string) (cuda.Module, []string) {
	t.Helper()
	arch, _ := archOption(t, false)
	p, err := cuda.CreateProgram(src, name, headers)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy()
	for _, e := range exprs {
		if err := p.AddNameExpression(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Compile([]string{arch, "-std=c++17"}); err != nil {
		t.Fatal(err)
	}
	lowered := make([]string, len(exprs))
	for i, e := range exprs {
		if lowered[i], err = p.LoweredName(e); err != nil {
			t.Fatal(err)
		}
	}
	cubin, err := p.CUBIN()
	if err != nil || len(cubin) == 0 {
		t.Fatalf("CUBIN: %d bytes, %v", len(cubin), err)
	}
	m, err := cuda.ModuleLoadData(cubin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unload() })
	return m, lowered
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 1))
}

func randF32(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.Float64()*2 - 1)
	}
	return x
}

// devF32 copies x to a new device buffer, freed at cleanup.
func devF32(t testing.TB, x []float32) cuda.DevicePtr {
	t.Helper()
	p, err := cuda.MemAlloc(int64(4 * max(len(x), 1)))
	must(t, err)
	t.Cleanup(func() { cuda.MemFree(p) })
	if len(x) > 0 {
		must(t, cuda.MemcpyHtoD(p, unsafe.Pointer(&x[0]), int64(4*len(x))))
	}
	// A pageable HtoD copy may still be in flight when it returns, and
	// non-blocking streams do not wait for the legacy stream.
	must(t, cuda.CtxSynchronize())
	return p
}

func readF32(t testing.TB, p cuda.DevicePtr, n int) []float32 {
	t.Helper()
	x := make([]float32, n)
	must(t, cuda.MemcpyDtoH(unsafe.Pointer(&x[0]), p, int64(4*n)))
	return x
}

func grid1(n, block int) ([3]uint32, [3]uint32) {
	return [3]uint32{uint32((n + block - 1) / block), 1, 1}, [3]uint32{uint32(block), 1, 1}
}

const saxpySrc = `
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) y[i] = a * x[i] + y[i];
}
`

func TestDeviceAndMemInfo(t *testing.T) {
	cudatest.RequireGPU(t)
	d, err := cuda.GetDevice(0)
	must(t, err)
	name, err := d.Name()
	if err != nil || name == "" {
		t.Fatalf("Name = %q, %v", name, err)
	}
	total, err := d.TotalMem()
	must(t, err)
	for _, a := range []cuda.DeviceAttribute{cuda.AttrMultiprocessorCount, cuda.AttrClockRate, cuda.AttrMemoryClockRate,
		cuda.AttrGlobalMemoryBusWidth, cuda.AttrL2CacheSize, cuda.AttrMaxSharedMemoryPerBlockOptin} {
		v, err := d.Attribute(a)
		if err != nil || v <= 0 {
			t.Errorf("attribute %d = %d, %v", a, v, err)
		}
	}
	vmm, err := d.Attribute(cuda.AttrVirtualMemoryManagementSupported)
	must(t, err)
	fdOK, err := d.Attribute(cuda.AttrHandleTypePosixFileDescriptorSupported)
	must(t, err)
	t.Logf("%s: %d MiB, VMM %d, POSIX fd %d", name, total>>20, vmm, fdOK)
	free0, total0, err := cuda.MemGetInfo()
	must(t, err)
	if total0 <= 0 || free0 <= 0 || free0 > total0 || total0 > total {
		t.Fatalf("MemGetInfo free %d total %d (device %d)", free0, total0, total)
	}
	const n = 256 << 20
	p, err := cuda.MemAlloc(n)
	must(t, err)
	free1, _, err := cuda.MemGetInfo()
	must(t, err)
	must(t, cuda.MemFree(p))
	if free0-free1 < n-(8<<20) {
		t.Fatalf("free memory went from %d to %d after allocating %d", free0, free1, n)
	}
}

func TestSaxpyCubinAndPTX(t *testing.T) {
	cudatest.RequireGPU(t)
	r := newRand(t)
	const n = 10007
	x, y := randF32(r, n), randF32(r, n)
	a := float32(r.Float64()*4 - 2)
	for _, virtual := range []bool{false, true} {
		arch, sm := archOption(t, virtual)
		p, err := cuda.CreateProgram(saxpySrc, "saxpy.cu", nil)
		must(t, err)
		must(t, p.Compile([]string{arch}))
		var img []byte
		if virtual {
			img, err = p.PTX()
			if err == nil && !strings.Contains(string(img), ".entry saxpy") {
				err = fmt.Errorf("PTX without the saxpy entry")
			}
		} else {
			img, err = p.CUBIN()
		}
		must(t, err)
		must(t, p.Destroy())
		m, err := cuda.ModuleLoadData(img)
		must(t, err)
		f, err := m.Function("saxpy")
		must(t, err)
		if regs, err := f.Attribute(cuda.FuncNumRegs); err != nil || regs <= 0 {
			t.Errorf("NumRegs = %d, %v", regs, err)
		}
		if mt, err := f.Attribute(cuda.FuncMaxThreadsPerBlock); err != nil || mt < 256 {
			t.Errorf("MaxThreadsPerBlock = %d, %v", mt, err)
		}
		if bv, err := f.Attribute(cuda.FuncBinaryVersion); err != nil || bv != sm {
			t.Errorf("BinaryVersion = %d, %v; want %d", bv, err, sm)
		}
		if pv, err := f.Attribute(cuda.FuncPTXVersion); err != nil || pv <= 0 {
			t.Errorf("PTXVersion = %d, %v", pv, err)
		}
		for _, attr := range []cuda.FunctionAttribute{cuda.FuncSharedSizeBytes, cuda.FuncLocalSizeBytes, cuda.FuncConstSizeBytes} {
			if v, err := f.Attribute(attr); err != nil || v < 0 {
				t.Errorf("attribute %d = %d, %v", attr, v, err)
			}
		}
		must(t, f.SetAttribute(cuda.FuncMaxDynamicSharedSizeBytes, 64<<10))
		if v, err := f.Attribute(cuda.FuncMaxDynamicSharedSizeBytes); err != nil || v != 64<<10 {
			t.Errorf("MaxDynamicSharedSizeBytes after set = %d, %v", v, err)
		}
		dx, dy := devF32(t, x), devF32(t, y)
		nn := int32(n)
		g, b := grid1(n, 256)
		must(t, cuda.LaunchKernel(f, g, b, 0, 0, unsafe.Pointer(&a), unsafe.Pointer(&dx), unsafe.Pointer(&dy), unsafe.Pointer(&nn)))
		must(t, cuda.CtxSynchronize())
		got := readF32(t, dy, n)
		for i := range got {
			want := float64(a)*float64(x[i]) + float64(y[i])
			if math.Abs(float64(got[i])-want) > 1e-6*(1+math.Abs(want)) {
				t.Fatalf("virtual=%v: y[%d] = %g, want %g", virtual, i, got[i], want)
			}
		}
		must(t, m.Unload())
	}
}

func TestCompileErrorHasLog(t *testing.T) {
	cudatest.RequireGPU(t)
	arch, _ := archOption(t, false)
	src := "extern \"C\" __global__ void k(float* y) {\n\ty[0] = 1.0f;\n\ty[1] = undefined_name;\n}\n"
	p, err := cuda.CreateProgram(src, "bad.cu", nil)
	must(t, err)
	defer p.Destroy()
	err = p.Compile([]string{arch})
	var ce *cuda.CompileError
	if !errors.As(err, &ce) || !errors.Is(err, cuda.NVRTCErrorCompilation) {
		t.Fatalf("Compile: %v", err)
	}
	if !strings.Contains(ce.Log, "bad.cu(3)") || !strings.Contains(err.Error(), "undefined_name") {
		t.Fatalf("log lacks file:line: %q", ce.Log)
	}
	log, err := p.Log()
	if err != nil || log != strings.TrimRight(ce.Log, "\x00") {
		t.Fatalf("Log() = %q, %v", log, err)
	}
	p2, err := cuda.CreateProgram(saxpySrc, "saxpy.cu", nil)
	must(t, err)
	defer p2.Destroy()
	err = p2.Compile([]string{arch, "-O3"}) // NVRTC rejects -O3 (DESIGN.md)
	var code cuda.NVRTCResult
	if !errors.As(err, &code) {
		t.Fatalf("-O3: %v, want an NVRTC error", err)
	}
	t.Logf("-O3: %v", err)
}

func TestNameExpressionsAndHeaders(t *testing.T) {
	cudatest.RequireGPU(t)
	src := `#include "scale.h"
template <typename T> __global__ void scale(T* x, T a, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) x[i] = SCALE(x[i], a);
}
`
	hdr := map[string]string{"scale.h": "#define SCALE(v, a) ((v) * (a) + (T)1)\n"}
	m, low := build(t, src, "scale.cu", hdr, "scale<float>", "scale<double>")
	if low[0] == low[1] || !strings.HasPrefix(low[0], "_Z") {
		t.Fatalf("lowered names %q", low)
	}
	f, err := m.Function(low[0])
	must(t, err)
	r := newRand(t)
	const n = 999
	x := randF32(r, n)
	dx := devF32(t, x)
	a, nn := float32(1.5), int32(n)
	g, b := grid1(n, 128)
	must(t, cuda.LaunchKernel(f, g, b, 0, 0, unsafe.Pointer(&dx), unsafe.Pointer(&a), unsafe.Pointer(&nn)))
	must(t, cuda.CtxSynchronize())
	got := readF32(t, dx, n)
	for i := range got {
		want := float64(x[i])*1.5 + 1
		if math.Abs(float64(got[i])-want) > 1e-6*(1+math.Abs(want)) {
			t.Fatalf("x[%d] = %g, want %g", i, got[i], want)
		}
	}
	if _, err := m.Function(low[1]); err != nil {
		t.Fatalf("double instance: %v", err)
	}
}

const stepSrc = `
extern "C" __global__ void step(float* y, const float* x, float k, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) y[i] = y[i] * 0.5f + x[i] * k;
}
`

func TestGraphReplayEqualsEager(t *testing.T) {
	cudatest.RequireGPU(t)
	m, _ := build(t, stepSrc, "step.cu", nil)
	f, err := m.Function("step")
	must(t, err)
	r := newRand(t)
	const n, launches = 4099, 64
	x, y0 := randF32(r, n), randF32(r, n)
	dx := devF32(t, x)
	s, err := cuda.StreamCreate(true)
	must(t, err)
	defer s.Destroy()
	nn := int32(n)
	g, b := grid1(n, 256)
	run := func(dy cuda.DevicePtr, ks []float32) {
		for _, k := range ks {
			k := k
			must(t, cuda.LaunchKernel(f, g, b, 0, s, unsafe.Pointer(&dy), unsafe.Pointer(&dx), unsafe.Pointer(&k), unsafe.Pointer(&nn)))
		}
	}
	ks1, ks2 := make([]float32, launches), make([]float32, launches)
	for i := range ks1 {
		ks1[i], ks2[i] = float32(i+1)/launches, float32(launches-i)/launches-0.3
	}
	// Eager: twice the sequence ks1.
	eager := devF32(t, y0)
	run(eager, ks1)
	run(eager, ks1)
	must(t, s.Synchronize())
	want := readF32(t, eager, n)

	// Captured once, replayed twice.
	dy := devF32(t, y0)
	must(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	if c, err := s.IsCapturing(); err != nil || !c {
		t.Fatalf("IsCapturing during capture = %v, %v", c, err)
	}
	run(dy, ks1)
	graph, err := s.EndCapture()
	must(t, err)
	defer graph.Destroy()
	if c, err := s.IsCapturing(); err != nil || c {
		t.Fatalf("IsCapturing after capture = %v, %v", c, err)
	}
	exec, err := graph.Instantiate()
	must(t, err)
	defer exec.Destroy()
	if got := readF32(t, dy, n); !equalF32(got, y0) {
		t.Fatal("capture ran the kernels instead of recording them")
	}
	must(t, exec.Launch(s))
	must(t, exec.Launch(s))
	must(t, s.Synchronize())
	if got := readF32(t, dy, n); !equalF32(got, want) {
		t.Fatal("graph replay differs from eager launches")
	}

	// Update the executable graph with the same topology, other scalars.
	eager2 := devF32(t, y0)
	run(eager2, ks2)
	must(t, s.Synchronize())
	want2 := readF32(t, eager2, n)
	dy2 := devF32(t, y0)
	must(t, s.BeginCapture(cuda.CaptureModeThreadLocal))
	run(dy2, ks2)
	graph2, err := s.EndCapture()
	must(t, err)
	defer graph2.Destroy()
	must(t, exec.Update(graph2))
	must(t, exec.Launch(s))
	must(t, s.Synchronize())
	if got := readF32(t, dy2, n); !equalF32(got, want2) {
		t.Fatal("updated graph differs from eager launches")
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

func TestStreamsEventsAsyncCopies(t *testing.T) {
	cudatest.RequireGPU(t)
	const n = 1 << 20
	s, err := cuda.StreamCreate(false)
	must(t, err)
	defer s.Destroy()
	host, err := cuda.MemHostAlloc(4 * n)
	must(t, err)
	defer cuda.MemFreeHost(host)
	h := unsafe.Slice((*uint32)(host), n)
	r := newRand(t)
	v := r.Uint32()
	p, err := cuda.MemAlloc(4 * n)
	must(t, err)
	defer cuda.MemFree(p)
	q, err := cuda.MemAlloc(4 * n)
	must(t, err)
	defer cuda.MemFree(q)
	start, err := cuda.EventCreate(cuda.EventDefault)
	must(t, err)
	defer start.Destroy()
	end, err := cuda.EventCreate(cuda.EventDefault)
	must(t, err)
	defer end.Destroy()
	must(t, start.Record(s))
	must(t, cuda.MemsetD32Async(p, v, n, s))
	must(t, cuda.MemcpyDtoDAsync(q, p, 4*n, s))
	must(t, cuda.MemcpyDtoHAsync(host, q, 4*n, s))
	must(t, end.Record(s))
	must(t, end.Synchronize())
	if done, err := end.Query(); err != nil || !done {
		t.Fatalf("Query after Synchronize = %v, %v", done, err)
	}
	if done, err := s.Query(); err != nil || !done {
		t.Fatalf("stream Query = %v, %v", done, err)
	}
	ms, err := cuda.EventElapsed(start, end)
	if err != nil || ms < 0 {
		t.Fatalf("EventElapsed = %g, %v", ms, err)
	}
	for i, x := range h {
		if x != v {
			t.Fatalf("word %d = %#x, want %#x", i, x, v)
		}
	}
	for i := range h {
		h[i] = uint32(i)
	}
	must(t, cuda.MemcpyHtoDAsync(p, host, 4*n, s))
	must(t, s.Synchronize())
	must(t, cuda.MemsetD8(q, 0xab, 4*n))
	got := make([]uint32, n)
	must(t, cuda.MemcpyDtoH(unsafe.Pointer(&got[0]), p, 4*n))
	for i, x := range got {
		if x != uint32(i) {
			t.Fatalf("after HtoDAsync word %d = %d", i, x)
		}
	}
	must(t, cuda.MemcpyDtoH(unsafe.Pointer(&got[0]), q, 4*n))
	if got[n-1] != 0xabababab {
		t.Fatalf("MemsetD8: %#x", got[n-1])
	}
}

// childMain runs in the re-executed test binary: it makes the primary
// context current and plays one role, printing its result on stdout.
func childMain(role string) error {
	runtime.LockOSThread()
	d, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	ctx, err := cuda.PrimaryContext(d)
	if err != nil {
		return err
	}
	defer ctx.Release()
	if err := ctx.SetCurrent(); err != nil {
		return err
	}
	switch role {
	case "ipc":
		return childIPC()
	case "vmm":
		return childVMM(d)
	case "event":
		return childEvent()
	}
	return fmt.Errorf("unknown role %q", role)
}

func hexArg(name string, n int) ([]byte, error) {
	b, err := hex.DecodeString(os.Getenv(name))
	if err != nil || len(b) != n {
		return nil, fmt.Errorf("%s: %d bytes, %v", name, len(b), err)
	}
	return b, nil
}

const childMarker = 0x600dcafe

// childIPC opens the parent's allocation by legacy IPC handle, prints the
// SHA-256 of its contents and writes the marker into its first word.
func childIPC() error {
	b, err := hexArg("GPUKIT_TEST_HANDLE", 64)
	if err != nil {
		return err
	}
	size, err := strconv.Atoi(os.Getenv("GPUKIT_TEST_SIZE"))
	if err != nil {
		return err
	}
	p, err := cuda.IpcOpenMemHandle(cuda.IpcMemHandle(b))
	if err != nil {
		return err
	}
	defer cuda.IpcCloseMemHandle(p)
	return hashAndMark(p, size)
}

func hashAndMark(p cuda.DevicePtr, size int) error {
	buf := make([]byte, size)
	if err := cuda.MemcpyDtoH(unsafe.Pointer(&buf[0]), p, int64(size)); err != nil {
		return err
	}
	sum := sha256.Sum256(buf)
	if err := cuda.MemsetD32(p, childMarker, 1); err != nil {
		return err
	}
	if err := cuda.CtxSynchronize(); err != nil {
		return err
	}
	fmt.Println(hex.EncodeToString(sum[:]))
	return nil
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func checkMarker(t *testing.T, p cuda.DevicePtr) {
	t.Helper()
	var w uint32
	must(t, cuda.MemcpyDtoH(unsafe.Pointer(&w), p, 4))
	if w != childMarker {
		t.Fatalf("the child's write is not visible: %#x", w)
	}
}

func TestLegacyIPCChild(t *testing.T) {
	cudatest.RequireGPU(t)
	const size = 3 << 20
	data := randBytes(newRand(t), size)
	p, err := cuda.MemAlloc(size)
	must(t, err)
	defer cuda.MemFree(p)
	must(t, cuda.MemcpyHtoD(p, unsafe.Pointer(&data[0]), size))
	h, err := cuda.IpcGetMemHandle(p)
	must(t, err)
	if _, err := cuda.IpcOpenMemHandle(h); err == nil {
		t.Error("IpcOpenMemHandle succeeded in the exporting process")
	}
	out := runChild(t, "ipc", []string{"GPUKIT_TEST_HANDLE=" + hex.EncodeToString(h[:]), "GPUKIT_TEST_SIZE=" + strconv.Itoa(size)})
	sum := sha256.Sum256(data)
	if out != hex.EncodeToString(sum[:]) {
		t.Fatalf("child read other bytes: %s", out)
	}
	checkMarker(t, p)
}

// childVMM receives a VMM allocation's fd over the Unix socket at fd 3
// (SCM_RIGHTS), maps it, prints the SHA-256 of its contents and writes the
// marker.
func childVMM(d cuda.Device) error {
	size, err := strconv.Atoi(os.Getenv("GPUKIT_TEST_SIZE"))
	if err != nil {
		return err
	}
	oob := make([]byte, unix.CmsgSpace(4))
	msg := make([]byte, 1)
	_, oobn, _, _, err := unix.Recvmsg(3, msg, oob, 0)
	if err != nil {
		return err
	}
	cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(cmsgs) != 1 {
		return fmt.Errorf("control messages: %d, %v", len(cmsgs), err)
	}
	fds, err := unix.ParseUnixRights(&cmsgs[0])
	if err != nil || len(fds) != 1 {
		return fmt.Errorf("fds: %v, %v", fds, err)
	}
	defer unix.Close(fds[0])
	h, err := cuda.MemImportFromFD(fds[0])
	if err != nil {
		return err
	}
	defer cuda.MemRelease(h)
	p, err := cuda.MemAddressReserve(int64(size), 0)
	if err != nil {
		return err
	}
	defer cuda.MemAddressFree(p, int64(size))
	if err := cuda.MemMap(p, int64(size), h); err != nil {
		return err
	}
	defer cuda.MemUnmap(p, int64(size))
	if err := cuda.MemSetAccess(p, int64(size), d); err != nil {
		return err
	}
	return hashAndMark(p, size)
}

func TestVMMExportFDChild(t *testing.T) {
	cudatest.RequireGPU(t)
	d, err := cuda.GetDevice(0)
	must(t, err)
	if ok, err := d.Attribute(cuda.AttrHandleTypePosixFileDescriptorSupported); err != nil || ok == 0 {
		t.Fatalf("POSIX fd handles not supported: %d, %v", ok, err)
	}
	gran, err := cuda.MemGetAllocationGranularity(d, false)
	must(t, err)
	rec, err := cuda.MemGetAllocationGranularity(d, true)
	must(t, err)
	if gran <= 0 || rec < gran || rec%gran != 0 {
		t.Fatalf("granularity %d, recommended %d", gran, rec)
	}
	size := 2 * gran
	h, err := cuda.MemCreate(size, d)
	must(t, err)
	defer cuda.MemRelease(h)
	p, err := cuda.MemAddressReserve(size, 0)
	must(t, err)
	defer cuda.MemAddressFree(p, size)
	must(t, cuda.MemMap(p, size, h))
	defer cuda.MemUnmap(p, size)
	must(t, cuda.MemSetAccess(p, size, d))
	data := randBytes(newRand(t), int(size))
	must(t, cuda.MemcpyHtoD(p, unsafe.Pointer(&data[0]), size))
	fd, err := cuda.MemExportToFD(h)
	must(t, err)
	defer unix.Close(fd)

	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	must(t, err)
	parent := os.NewFile(uintptr(pair[0]), "parent")
	child := os.NewFile(uintptr(pair[1]), "child")
	defer parent.Close()
	must(t, unix.Sendmsg(pair[0], []byte{1}, unix.UnixRights(fd), nil, 0))
	out := runChild(t, "vmm", []string{"GPUKIT_TEST_SIZE=" + strconv.FormatInt(size, 10)}, child)
	child.Close()
	sum := sha256.Sum256(data)
	if out != hex.EncodeToString(sum[:]) {
		t.Fatalf("child read other bytes: %s", out)
	}
	checkMarker(t, p)
}

const spinSrc = `
__device__ unsigned long long now() {
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}
extern "C" __global__ void spin_then_write(unsigned* p, unsigned v, unsigned long long ns) {
	unsigned long long t0 = now();
	while (now() - t0 < ns) {}
	*p = v;
}
extern "C" __global__ void copy_plus_one(unsigned* out, const unsigned* in) { *out = *in + 1; }
`

// childEvent waits on the parent's interprocess event on its own stream,
// then runs a kernel that reads the parent's buffer, and prints what it saw
// and whether the event was still pending when it started waiting.
func childEvent() error {
	mb, err := hexArg("GPUKIT_TEST_HANDLE", 64)
	if err != nil {
		return err
	}
	eb, err := hexArg("GPUKIT_TEST_EVENT", 64)
	if err != nil {
		return err
	}
	in, err := cuda.IpcOpenMemHandle(cuda.IpcMemHandle(mb))
	if err != nil {
		return err
	}
	defer cuda.IpcCloseMemHandle(in)
	ev, err := cuda.IpcOpenEventHandle(cuda.IpcEventHandle(eb))
	if err != nil {
		return err
	}
	defer ev.Destroy()
	// Compile before querying so the time spent here does not decide the test.
	arch := os.Getenv("GPUKIT_TEST_ARCH")
	p, err := cuda.CreateProgram(spinSrc, "spin.cu", nil)
	if err != nil {
		return err
	}
	defer p.Destroy()
	if err := p.Compile([]string{arch}); err != nil {
		return err
	}
	cubin, err := p.CUBIN()
	if err != nil {
		return err
	}
	m, err := cuda.ModuleLoadData(cubin)
	if err != nil {
		return err
	}
	defer m.Unload()
	f, err := m.Function("copy_plus_one")
	if err != nil {
		return err
	}
	out, err := cuda.MemAlloc(4)
	if err != nil {
		return err
	}
	defer cuda.MemFree(out)
	s, err := cuda.StreamCreate(true)
	if err != nil {
		return err
	}
	defer s.Destroy()
	done, _ := ev.Query()
	if err := s.WaitEvent(ev); err != nil {
		return err
	}
	one := [3]uint32{1, 1, 1}
	if err := cuda.LaunchKernel(f, one, one, 0, s, unsafe.Pointer(&out), unsafe.Pointer(&in)); err != nil {
		return err
	}
	var v uint32
	if err := s.Synchronize(); err != nil {
		return err
	}
	if err := cuda.MemcpyDtoH(unsafe.Pointer(&v), out, 4); err != nil {
		return err
	}
	fmt.Printf("%d %v\n", v, !done)
	return nil
}

func TestInterprocessEventOrdersChild(t *testing.T) {
	cudatest.RequireGPU(t)
	arch, _ := archOption(t, false)
	m, _ := build(t, spinSrc, "spin.cu", nil)
	spin, err := m.Function("spin_then_write")
	must(t, err)
	buf, err := cuda.MemAlloc(4)
	must(t, err)
	defer cuda.MemFree(buf)
	s, err := cuda.StreamCreate(true)
	must(t, err)
	defer s.Destroy()
	must(t, cuda.MemsetD32Async(buf, 0, 1, s))
	ev, err := cuda.EventCreate(cuda.EventInterprocess | cuda.EventDisableTiming)
	must(t, err)
	defer ev.Destroy()
	v := uint32(newRand(t).IntN(1<<30)) + 7
	ns := uint64(3e9) // long enough for the child to start and wait
	one := [3]uint32{1, 1, 1}
	must(t, cuda.LaunchKernel(spin, one, one, 0, s, unsafe.Pointer(&buf), unsafe.Pointer(&v), unsafe.Pointer(&ns)))
	must(t, ev.Record(s))
	mh, err := cuda.IpcGetMemHandle(buf)
	must(t, err)
	eh, err := cuda.IpcGetEventHandle(ev)
	must(t, err)
	out := runChild(t, "event", []string{"GPUKIT_TEST_HANDLE=" + hex.EncodeToString(mh[:]),
		"GPUKIT_TEST_EVENT=" + hex.EncodeToString(eh[:]), "GPUKIT_TEST_ARCH=" + arch})
	must(t, s.Synchronize())
	var got uint32
	var pending bool
	if _, err := fmt.Sscanf(out, "%d %t", &got, &pending); err != nil {
		t.Fatalf("child output %q: %v", out, err)
	}
	if got != v+1 {
		t.Fatalf("child's kernel saw %d, want the parent's final value %d (+1)", got-1, v)
	}
	if !pending {
		t.Log("the parent's kernel had already finished when the child began waiting; ordering was not exercised")
	}
}

// TestTensorMapEncodeFromFreshGoroutines encodes the same im2col and tiled
// tensor maps on a grown stack and in many new goroutines (whose small
// stacks grow, and move, at different depths of the call chain down to
// the driver) and asks for the same non-zero bytes. Before encodeAligned pinned its buffer
// the driver wrote some maps into a stack that had since moved, and they
// came back as zeros (a GPU machine, 2026-11-29: the convolution's TMA
// copies then faulted with CUDA_ERROR_ILLEGAL_INSTRUCTION).
func TestTensorMapEncodeFromFreshGoroutines(t *testing.T) {
	cudatest.RequireGPU(t)
	const c, w, h, n = 64, 32, 32, 16
	x, err := cuda.MemAlloc(2 * c * w * h * n)
	must(t, err)
	defer cuda.MemFree(x)
	encode := func() (im, ti cuda.TensorMap, err error) {
		err = cuda.EncodeIm2col(&im, cuda.TensorMapBF16, x, []uint64{c, w, h, n}, []uint64{2 * c, 2 * c * w, 2 * c * w * h},
			[]int32{-1, -1}, []int32{-1, -1}, 64, 128, []uint32{1, 1, 1, 1}, cuda.TensorMapSwizzle128)
		if err == nil {
			err = cuda.EncodeTiled(&ti, cuda.TensorMapBF16, x, []uint64{9 * c, 64}, []uint64{2 * 9 * c}, []uint32{64, 64},
				cuda.TensorMapSwizzle128)
		}
		return im, ti, err
	}
	var grow func(int) (cuda.TensorMap, cuda.TensorMap, error)
	grow = func(d int) (cuda.TensorMap, cuda.TensorMap, error) {
		var pad [64]uint64
		if d > 0 {
			pad[d%64] = uint64(d)
			a, b, err := grow(d - 1)
			runtime.KeepAlive(pad)
			return a, b, err
		}
		return encode()
	}
	wantIm, wantTi, err := grow(64) // a stack of 32 KiB and more, grown before the calls
	must(t, err)
	if wantIm == (cuda.TensorMap{}) || wantTi == (cuda.TensorMap{}) {
		t.Fatalf("maps encoded on a grown stack are zero: im2col %x, tiled %x", wantIm, wantTi)
	}
	// Each goroutine makes the context current (the encoder needs one),
	// then calls down i frames of about 300 bytes first, so that across
	// the goroutines the stack's first growth falls at every depth of the
	// encode's call chain.
	const workers = 64
	errs := make(chan error, workers)
	var down func(int) (cuda.TensorMap, cuda.TensorMap, error)
	down = func(d int) (cuda.TensorMap, cuda.TensorMap, error) {
		var pad [32]uint64
		if d > 0 {
			pad[d%32] = uint64(d)
			a, b, err := down(d - 1)
			runtime.KeepAlive(pad)
			return a, b, err
		}
		return encode()
	}
	for i := 0; i < workers; i++ {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if err := cudatest.Context().SetCurrent(); err != nil {
				errs <- err
				return
			}
			im, ti, err := down(i)
			switch {
			case err != nil:
			case im != wantIm:
				err = fmt.Errorf("im2col map %x, want %x", im, wantIm)
			case ti != wantTi:
				err = fmt.Errorf("tiled map %x, want %x", ti, wantTi)
			}
			errs <- err
		}()
	}
	for i := 0; i < workers; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
