package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"unsafe"
)

var (
	pNvrtcVersion           = newProc(libNVRTC, "nvrtcVersion")
	pNvrtcNumSupportedArchs = newProc(libNVRTC, "nvrtcGetNumSupportedArchs")
	pNvrtcSupportedArchs    = newProc(libNVRTC, "nvrtcGetSupportedArchs")
	pNvrtcCreateProgram     = newProc(libNVRTC, "nvrtcCreateProgram")
	pNvrtcDestroyProgram    = newProc(libNVRTC, "nvrtcDestroyProgram")
	pNvrtcCompileProgram    = newProc(libNVRTC, "nvrtcCompileProgram")
	pNvrtcGetPTXSize        = newProc(libNVRTC, "nvrtcGetPTXSize")
	pNvrtcGetPTX            = newProc(libNVRTC, "nvrtcGetPTX")
	pNvrtcGetCUBINSize      = newProc(libNVRTC, "nvrtcGetCUBINSize")
	pNvrtcGetCUBIN          = newProc(libNVRTC, "nvrtcGetCUBIN")
	pNvrtcGetLogSize        = newProc(libNVRTC, "nvrtcGetProgramLogSize")
	pNvrtcGetLog            = newProc(libNVRTC, "nvrtcGetProgramLog")
	pNvrtcAddNameExpression = newProc(libNVRTC, "nvrtcAddNameExpression")
	pNvrtcGetLoweredName    = newProc(libNVRTC, "nvrtcGetLoweredName")
	pNvrtcGetPCHHeapSize    = newProc(libNVRTC, "nvrtcGetPCHHeapSize")
	pNvrtcSetPCHHeapSize    = newProc(libNVRTC, "nvrtcSetPCHHeapSize")
	pNvrtcGetPCHStatus      = newProc(libNVRTC, "nvrtcGetPCHCreateStatus")
	pNvrtcGetPCHHeapReq     = newProc(libNVRTC, "nvrtcGetPCHHeapSizeRequired")
)

// ErrProgramDestroyed: a Program method was called after Destroy.
var ErrProgramDestroyed = errors.New("nvrtc: program already destroyed")

// NVRTCVersion returns NVRTC's CUDA version, e.g. 13, 0.
func NVRTCVersion() (major, minor int, err error) {
	var ma, mi int32
	if err := pNvrtcVersion.nvrtc(uintptr(unsafe.Pointer(&ma)), uintptr(unsafe.Pointer(&mi))); err != nil {
		return 0, 0, err
	}
	return int(ma), int(mi), nil
}

// SupportedArchs returns the SM versions NVRTC can compile for, as
// 10*major+minor (e.g. 75, 80, ..., 90, 100), ascending.
func SupportedArchs() ([]int, error) {
	var n int32
	if err := pNvrtcNumSupportedArchs.nvrtc(uintptr(unsafe.Pointer(&n))); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, nil
	}
	a := make([]int32, n)
	if err := pNvrtcSupportedArchs.nvrtc(uintptr(unsafe.Pointer(&a[0]))); err != nil {
		return nil, err
	}
	out := make([]int, n)
	for i, v := range a {
		out[i] = int(v)
	}
	return out, nil
}

// PCHHeapSize returns the size in bytes of NVRTC's precompiled-header heap.
// Errors name the symbol when the library predates PCH (CUDA < 12.8).
func PCHHeapSize() (int64, error) {
	var n uint64
	if err := pNvrtcGetPCHHeapSize.nvrtc(uintptr(unsafe.Pointer(&n))); err != nil {
		return 0, err
	}
	return int64(n), nil
}

// SetPCHHeapSize sets the size in bytes of the precompiled-header heap.
func SetPCHHeapSize(n int64) error {
	if n < 0 {
		return fmt.Errorf("nvrtc: PCH heap size %d: %w", n, NVRTCResult(3))
	}
	return pNvrtcSetPCHHeapSize.nvrtc(uintptr(n))
}

// CompileError is a failed nvrtcCompileProgram with the compiler's log (the
// lines read "name.cu(LINE): error: ...").
type CompileError struct {
	Name string
	Code NVRTCResult
	Log  string
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("nvrtc: compile %s: %v\n%s", e.Name, e.Code, strings.TrimRight(e.Log, "\n\x00"))
}

// Unwrap returns the NVRTCResult.
func (e *CompileError) Unwrap() error { return e.Code }

// Program is an NVRTC program (nvrtcProgram). Its methods are safe for
// concurrent use (they serialise on the program).
type Program struct {
	mu   sync.Mutex
	h    uintptr
	name string
}

// cstr returns s as a NUL-terminated byte slice.
func cstr(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

// cstrArray builds a C array of C strings (const char* const*) whose memory
// is pinned with pin, so C may read it until pin.Unpin. It returns nil for an
// empty list.
func cstrArray(pin *runtime.Pinner, ss []string) unsafe.Pointer {
	if len(ss) == 0 {
		return nil
	}
	arr := make([]*byte, len(ss))
	for i, s := range ss {
		b := cstr(s)
		pin.Pin(&b[0])
		arr[i] = &b[0]
	}
	pin.Pin(&arr[0])
	return unsafe.Pointer(&arr[0])
}

// gostr copies a NUL-terminated C string owned by a library.
func gostr(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// CreateProgram creates an NVRTC program from CUDA C++ source src; name is
// the file name used in diagnostics ("saxpy.cu"). headers maps an include
// name (as written in #include "...") to its source.
func CreateProgram(src, name string, headers map[string]string) (*Program, error) {
	if name == "" {
		name = "program.cu"
	}
	names := make([]string, 0, len(headers))
	for k := range headers {
		names = append(names, k)
	}
	sort.Strings(names)
	srcs := make([]string, len(names))
	for i, k := range names {
		srcs[i] = headers[k]
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	hdrs, incs := cstrArray(&pin, srcs), cstrArray(&pin, names)
	csrc, cname := cstr(src), cstr(name)
	var h uintptr
	err := pNvrtcCreateProgram.nvrtc(uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&csrc[0])),
		uintptr(unsafe.Pointer(&cname[0])), uintptr(len(names)), uintptr(hdrs), uintptr(incs))
	if err != nil {
		return nil, err
	}
	return &Program{h: h, name: name}, nil
}

// Name returns the program's file name.
func (p *Program) Name() string { return p.name }

// AddNameExpression registers a name expression such as "scale<float>" (a
// __global__ template instance) before Compile; LoweredName then returns
// its mangled name.
func (p *Program) AddNameExpression(expr string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h == 0 {
		return ErrProgramDestroyed
	}
	c := cstr(expr)
	return pNvrtcAddNameExpression.nvrtc(p.h, uintptr(unsafe.Pointer(&c[0])))
}

// Compile compiles the program with NVRTC options such as
// "--gpu-architecture=sm_90a", "-std=c++17", "--use_fast_math" (NVRTC
// rejects -O3). On failure the error is a *CompileError holding the log.
func (p *Program) Compile(opts []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h == 0 {
		return ErrProgramDestroyed
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	copts := cstrArray(&pin, opts)
	err := pNvrtcCompileProgram.nvrtc(p.h, uintptr(len(opts)), uintptr(copts))
	if err == nil {
		return nil
	}
	var code NVRTCResult
	if !errors.As(err, &code) {
		return err // library or symbol missing
	}
	log, lerr := p.logLocked()
	if lerr != nil {
		log = "(log unavailable: " + lerr.Error() + ")"
	}
	return &CompileError{Name: p.name, Code: code, Log: log}
}

// Log returns the compiler's log (warnings and errors) of the last Compile.
func (p *Program) Log() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h == 0 {
		return "", ErrProgramDestroyed
	}
	return p.logLocked()
}

func (p *Program) logLocked() (string, error) {
	b, err := p.output(pNvrtcGetLogSize, pNvrtcGetLog)
	return strings.TrimRight(string(b), "\x00"), err
}

// output reads a sized output (log, PTX, CUBIN) of the program.
func (p *Program) output(size, get *proc) ([]byte, error) {
	var n uint64
	if err := size.nvrtc(p.h, uintptr(unsafe.Pointer(&n))); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	b := make([]byte, n)
	if err := get.nvrtc(p.h, uintptr(unsafe.Pointer(&b[0]))); err != nil {
		return nil, err
	}
	return b, nil
}

// PTX returns the compiled PTX text, without NVRTC's trailing NUL
// (ModuleLoadData adds one when needed). Compile with a virtual arch
// ("--gpu-architecture=compute_90") to get PTX.
func (p *Program) PTX() ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h == 0 {
		return nil, ErrProgramDestroyed
	}
	b, err := p.output(pNvrtcGetPTXSize, pNvrtcGetPTX)
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b, err
}

// CUBIN returns the compiled cubin (an ELF image for one SM version).
// Compile with a real arch ("--gpu-architecture=sm_90a") to get one.
func (p *Program) CUBIN() ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h == 0 {
		return nil, ErrProgramDestroyed
	}
	return p.output(pNvrtcGetCUBINSize, pNvrtcGetCUBIN)
}

// LoweredName returns the mangled name of a name expression registered with
// AddNameExpression, after Compile: pass it to Module.Function.
func (p *Program) LoweredName(expr string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h == 0 {
		return "", ErrProgramDestroyed
	}
	c := cstr(expr)
	var out *byte // points into the program's memory; copied below
	if err := pNvrtcGetLoweredName.nvrtc(p.h, uintptr(unsafe.Pointer(&c[0])), uintptr(unsafe.Pointer(&out))); err != nil {
		return "", err
	}
	return gostr(out), nil
}

// PCHCreateStatus returns nil when the last Compile created or used a
// precompiled header, else the NVRTCResult saying why not
// (NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED, ..._HEAP_EXHAUSTED, ...).
func (p *Program) PCHCreateStatus() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h == 0 {
		return ErrProgramDestroyed
	}
	return pNvrtcGetPCHStatus.nvrtc(p.h)
}

// PCHHeapSizeRequired returns the PCH heap size in bytes the last Compile
// would have needed.
func (p *Program) PCHHeapSizeRequired() (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h == 0 {
		return 0, ErrProgramDestroyed
	}
	var n uint64
	if err := pNvrtcGetPCHHeapReq.nvrtc(p.h, uintptr(unsafe.Pointer(&n))); err != nil {
		return 0, err
	}
	return int64(n), nil
}

// Destroy frees the program; later calls return ErrProgramDestroyed.
func (p *Program) Destroy() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.h == 0 {
		return nil
	}
	h := p.h
	p.h = 0
	return pNvrtcDestroyProgram.nvrtc(uintptr(unsafe.Pointer(&h)))
}
