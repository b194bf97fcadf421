package cuda

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// withSearchDirs replaces the usual directories for the test.
func withSearchDirs(t *testing.T, dirs ...string) {
	old := searchDirs
	searchDirs = func() []string { return dirs }
	t.Cleanup(func() { searchDirs = old })
}

func TestLookupOrder(t *testing.T) {
	t.Setenv(EnvCUDAPath, "/env/a:/env/b")
	withSearchDirs(t, "/usual")
	l := &library{names: []string{"libfoo.so.2", "libfoo.so"}}
	want := []string{
		"/env/a/libfoo.so.2", "/env/a/libfoo.so", "/env/b/libfoo.so.2", "/env/b/libfoo.so",
		"libfoo.so.2", "libfoo.so",
		"/usual/libfoo.so.2", "/usual/libfoo.so",
	}
	if got := l.candidates(); !reflect.DeepEqual(got, want) {
		t.Fatalf("candidates:\n got %q\nwant %q", got, want)
	}
	t.Setenv(EnvCUDAPath, "")
	if got := l.candidates(); !reflect.DeepEqual(got, want[4:]) {
		t.Fatalf("without %s: got %q", EnvCUDAPath, got)
	}
}

func TestDefaultSearchDirs(t *testing.T) {
	dirs := defaultSearchDirs()
	if len(dirs) < 4 || dirs[0] != "/usr/local/cuda/lib64" {
		t.Fatalf("default dirs %q", dirs)
	}
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			t.Errorf("relative search dir %q", d)
		}
	}
}

func TestMissingLibraryMessage(t *testing.T) {
	empty := t.TempDir()
	t.Setenv(EnvCUDAPath, empty)
	withSearchDirs(t, t.TempDir())
	l := &library{names: []string{"libgpukit-absent.so.1", "libgpukit-absent.so"}, hint: "no such thing?"}
	err := l.load()
	if !errors.Is(err, ErrNoLibrary) {
		t.Fatalf("load: %v, want ErrNoLibrary", err)
	}
	want := "cuda: libgpukit-absent.so.1 not found (no such thing?); set GPUKIT_CUDA_PATH to the directory that holds it"
	if err.Error() != want {
		t.Fatalf("message\n got %q\nwant %q", err, want)
	}
	var le *LibraryError
	if !errors.As(err, &le) || le.Tried[0] != filepath.Join(empty, "libgpukit-absent.so.1") {
		t.Fatalf("tried %v", le)
	}
	if err2 := l.load(); err2 != err {
		t.Fatalf("second load gave %v, want the cached error", err2)
	}
	// A proc of a missing library reports the library, not the symbol.
	p := newProc(l, "anything")
	if _, err := p.call(1, 2); !errors.Is(err, ErrNoLibrary) {
		t.Fatalf("call: %v", err)
	}
	if err := p.cu(); !errors.Is(err, ErrNoLibrary) {
		t.Fatalf("cu: %v", err)
	}
}

func TestDriverMessageNamesLibraryAndVariable(t *testing.T) {
	e := &LibraryError{Lib: libDriver.names[0], Hint: libDriver.hint}
	want := "cuda: libcuda.so.1 not found (no NVIDIA driver?); set GPUKIT_CUDA_PATH to the directory that holds it"
	if e.Error() != want {
		t.Fatalf("got %q", e.Error())
	}
}

func TestBrokenLibraryIsReported(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "libgpukit-broken.so.1"), []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvCUDAPath, dir)
	withSearchDirs(t)
	l := &library{names: []string{"libgpukit-broken.so.1"}, hint: "?"}
	err := l.load()
	var le *LibraryError
	if !errors.As(err, &le) || le.Cause == "" {
		t.Fatalf("load: %v, want a LibraryError with the loader's cause", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "could not be loaded") || strings.Contains(msg, "\n") {
		t.Fatalf("message %q", msg)
	}
}

// libcPath finds the C library to stand in for a CUDA library.
func libcPath(t *testing.T) string {
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
		"/lib/aarch64-linux-gnu/libc.so.6", "/lib64/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no glibc at a known path")
	return ""
}

func TestEnvPathLoadsFirstAndSymbols(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("linux only")
	}
	dir := t.TempDir()
	link := filepath.Join(dir, "libgpukit-standin.so.1")
	if err := os.Symlink(libcPath(t), link); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvCUDAPath, dir)
	withSearchDirs(t)
	l := &library{names: []string{"libgpukit-standin.so.1"}}
	if err := l.load(); err != nil {
		t.Fatal(err)
	}
	if l.path != link {
		t.Fatalf("loaded %q, want %q", l.path, link)
	}
	missing := newProc(l, "gpukit_no_such_symbol")
	_, err := missing.call()
	var se *SymbolError
	if !errors.Is(err, ErrNoSymbol) || !errors.As(err, &se) || se.Symbol != "gpukit_no_such_symbol" ||
		!strings.Contains(err.Error(), "gpukit_no_such_symbol") {
		t.Fatalf("missing symbol: %v", err)
	}
	// The first name is missing, the fallback exists: getpid() must answer.
	pid := newProc(l, "gpukit_getpid_v2", "getpid")
	r, err := pid.call()
	if err != nil {
		t.Fatal(err)
	}
	if int(r) != os.Getpid() {
		t.Fatalf("getpid through purego = %d, want %d", r, os.Getpid())
	}
	// strlen reads a Go string passed in the call's argument list.
	strlen := newProc(l, "strlen")
	s := cstr("gpukit")
	n, err := strlen.call(uintptr(unsafe.Pointer(&s[0])))
	if err != nil || n != 6 {
		t.Fatalf("strlen = %d, %v", n, err)
	}
}

func TestResultNames(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{Result(2), "CUDA_ERROR_OUT_OF_MEMORY (2)"},
		{Result(201), "CUDA_ERROR_INVALID_CONTEXT (201)"},
		{Result(600), "CUDA_ERROR_NOT_READY (600)"},
		{Result(999), "CUDA_ERROR_UNKNOWN (999)"},
		{Result(12345), "CUresult(12345)"},
		{Result(-1), "CUresult(-1)"},
		{NVRTCResult(6), "NVRTC_ERROR_COMPILATION (6)"},
		{NVRTCResult(99), "nvrtcResult(99)"},
		{BLASStatus(7), "CUBLAS_STATUS_INVALID_VALUE (7)"},
		{BLASStatus(15), "CUBLAS_STATUS_NOT_SUPPORTED (15)"},
		{BLASStatus(2), "cublasStatus_t(2)"},
	}
	for _, c := range cases {
		if got := c.err.Error(); got != c.want {
			t.Errorf("%#v: got %q want %q", c.err, got, c.want)
		}
	}
	for code, name := range resultNames {
		if !strings.HasPrefix(name, "CUDA_") || code.Name() != name {
			t.Errorf("Result %d: %q", code, name)
		}
	}
	for code, name := range nvrtcNames {
		if !strings.HasPrefix(name, "NVRTC_") || code.Name() != name {
			t.Errorf("NVRTCResult %d: %q", code, name)
		}
	}
	for code, name := range blasNames {
		if !strings.HasPrefix(name, "CUBLAS_STATUS_") || code.Name() != name {
			t.Errorf("BLASStatus %d: %q", code, name)
		}
	}
}

func TestCallErrorWraps(t *testing.T) {
	err := error(&CallError{Func: "cuMemAlloc_v2", Err: Result(2)})
	if !errors.Is(err, ErrorOutOfMemory) || errors.Is(err, ErrorInvalidValue) {
		t.Fatalf("errors.Is on %v", err)
	}
	if err.Error() != "cuda: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)" {
		t.Fatalf("message %q", err)
	}
	var r Result
	if !errors.As(err, &r) || r != 2 {
		t.Fatalf("errors.As: %v", r)
	}
}

func TestStructLayouts(t *testing.T) {
	var p memAllocationProp
	var a memAccessDesc
	var h ltHeuristicResult
	var g graphExecUpdateResultInfo
	checks := []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof CUmemLocation", unsafe.Sizeof(memLocation{}), 8},
		{"sizeof CUmemAllocationProp", unsafe.Sizeof(p), 32},
		{"CUmemAllocationProp.location", unsafe.Offsetof(p.Location), 8},
		{"CUmemAllocationProp.win32HandleMetaData", unsafe.Offsetof(p.Win32HandleMetaData), 16},
		{"CUmemAllocationProp.allocFlags.compressionType", unsafe.Offsetof(p.CompressionType), 24},
		{"CUmemAllocationProp.allocFlags.usage", unsafe.Offsetof(p.Usage), 26},
		{"sizeof CUmemAccessDesc", unsafe.Sizeof(a), 12},
		{"CUmemAccessDesc.flags", unsafe.Offsetof(a.Flags), 8},
		{"sizeof cublasLtMatmulHeuristicResult_t", unsafe.Sizeof(h), 96},
		{"heuristic.workspaceSize", unsafe.Offsetof(h.WorkspaceSize), 64},
		{"heuristic.state", unsafe.Offsetof(h.State), 72},
		{"heuristic.wavesCount", unsafe.Offsetof(h.Waves), 76},
		{"sizeof CUgraphExecUpdateResultInfo", unsafe.Sizeof(g), 24},
		{"CUgraphExecUpdateResultInfo.errorNode", unsafe.Offsetof(g.ErrorNode), 8},
		{"sizeof CUipcMemHandle", unsafe.Sizeof(IpcMemHandle{}), 64},
		{"sizeof CUipcEventHandle", unsafe.Sizeof(IpcEventHandle{}), 64},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
	prop := deviceProp(3)
	if prop.Type != 1 || prop.RequestedHandleTypes != 1 || prop.Location != (memLocation{Type: 1, ID: 3}) {
		t.Errorf("deviceProp(3) = %+v", prop)
	}
}

func TestHandleWords(t *testing.T) {
	var h [64]byte
	for i := range h {
		h[i] = byte(i*7 + 1)
	}
	w := words(&h)
	var back [64]byte
	for i, v := range w {
		binary.LittleEndian.PutUint64(back[8*i:], uint64(v))
	}
	if back != h {
		t.Fatalf("words do not round-trip: %x", back)
	}
}

func TestCStrings(t *testing.T) {
	var pin runtime.Pinner
	defer pin.Unpin()
	ss := []string{"--gpu-architecture=sm_90a", "", "-std=c++17"}
	arr := cstrArray(&pin, ss)
	ptrs := unsafe.Slice((**byte)(arr), len(ss))
	for i, p := range ptrs {
		if got := gostr(p); got != ss[i] {
			t.Errorf("element %d = %q, want %q", i, got, ss[i])
		}
	}
	if cstrArray(&pin, nil) != nil {
		t.Error("empty list should be a NULL array")
	}
	if gostr(nil) != "" {
		t.Error("gostr(nil)")
	}
}

func TestGemmSpecNormalize(t *testing.T) {
	s, err := GemmSpec{TransA: true, M: 45, N: 67, K: 93, Epilogue: EpilogueReLUAuxBias}.normalized()
	if err != nil {
		t.Fatal(err)
	}
	// A stored K×M when transposed: its leading dimension defaults to K.
	if s.LDA != 93 || s.LDB != 93 || s.LDC != 45 || s.LDD != 45 || s.Batch != 1 || s.Compute != Compute32F {
		t.Fatalf("defaults: %+v", s)
	}
	if s.AuxLD != 128 {
		t.Fatalf("ReLU bit-mask aux ld = %d, want 128", s.AuxLD)
	}
	g, _ := GemmSpec{M: 45, N: 2, K: 3, Epilogue: EpilogueGELUAux}.normalized()
	if g.AuxLD != 45 {
		t.Fatalf("GELU aux ld = %d", g.AuxLD)
	}
	for _, bad := range []GemmSpec{{M: 0, N: 1, K: 1}, {M: 4, N: 4, K: 4, LDA: 3}, {M: 4, N: 4, K: 4, Batch: -1},
		{TransB: true, M: 4, N: 8, K: 4, LDB: 4}} {
		if _, err := bad.normalized(); !errors.Is(err, ErrBadGemm) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if !EpilogueReLUBias.usesBias() || EpilogueReLU.usesBias() || !EpilogueBGradB.usesBias() || !EpilogueDGELUBGrad.usesBias() {
		t.Error("usesBias")
	}
	if !EpilogueDReLU.usesAux() || EpilogueGELUBias.usesAux() {
		t.Error("usesAux")
	}
	if a := alignOf(0x1000, 0x2010, 0); a != 16 {
		t.Errorf("alignOf = %d", a)
	}
	if a := alignOf(0x1000, 0x2001); a != 1 {
		t.Errorf("alignOf odd = %d", a)
	}
}

func TestCompileErrorMessage(t *testing.T) {
	e := &CompileError{Name: "bad.cu", Code: NVRTCErrorCompilation, Log: "bad.cu(3): error: identifier \"x\" is undefined\n\x00"}
	var err error = e
	if !errors.Is(err, NVRTCErrorCompilation) || !strings.Contains(err.Error(), "bad.cu(3): error") {
		t.Fatalf("%v", err)
	}
}

func TestPythonRoots(t *testing.T) {
	dir := t.TempDir()
	venv := filepath.Join(dir, "venv", "bin")
	nopy := filepath.Join(dir, "other", "bin")
	for _, d := range []string{venv, nopy} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(venv, "python3"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A python3 directory is not a python3.
	if err := os.MkdirAll(filepath.Join(nopy, "python3"), 0o755); err != nil {
		t.Fatal(err)
	}
	got := pythonRoots(strings.Join([]string{"", "relative/bin", nopy, venv + "/"}, string(os.PathListSeparator)))
	want := []string{filepath.Join(dir, "venv", "lib")}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("pythonRoots = %q, want %q", got, want)
	}
	// The wheel's lib folder under that prefix is searched.
	lib := filepath.Join(dir, "venv", "lib", "python3.12", "site-packages", "nvidia", "nccl", "lib")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", venv)
	found := false
	for _, d := range defaultSearchDirs() {
		found = found || d == lib
	}
	if !found {
		t.Fatalf("%s not among the search dirs %q", lib, defaultSearchDirs())
	}
}

func TestNewLibraryMessageAndCall(t *testing.T) {
	t.Setenv(EnvCUDAPath, t.TempDir())
	withSearchDirs(t, t.TempDir())
	missing := NewLibrary("nccl", "NCCL not installed?", "libgpukit-absent-nccl.so.2")
	err := missing.Proc("ncclGetVersion").Find()
	want := "nccl: libgpukit-absent-nccl.so.2 not found (NCCL not installed?); set GPUKIT_CUDA_PATH to the directory that holds it"
	if !errors.Is(err, ErrNoLibrary) || err.Error() != want {
		t.Fatalf("Find: %v\nwant %q", err, want)
	}
	if missing.Path() != "" {
		t.Fatalf("Path of a missing library: %q", missing.Path())
	}
	if runtime.GOOS != "linux" {
		return
	}
	dir := t.TempDir()
	if err := os.Symlink(libcPath(t), filepath.Join(dir, "libgpukit-standin2.so.1")); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvCUDAPath, dir)
	l := NewLibrary("nccl", "?", "libgpukit-standin2.so.1")
	s := cstr("purego")
	n, err := l.Proc("gpukit_strlen_v2", "strlen").Call(uintptr(unsafe.Pointer(&s[0])))
	if err != nil || n != 6 {
		t.Fatalf("strlen through Library.Proc = %d, %v", n, err)
	}
	if l.Path() != filepath.Join(dir, "libgpukit-standin2.so.1") {
		t.Fatalf("Path = %q", l.Path())
	}
	if err := l.Proc("gpukit_no_such_symbol").Find(); !errors.Is(err, ErrNoSymbol) {
		t.Fatalf("missing symbol: %v", err)
	}
}
