package kernels

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"gpukit/libgpu/cuda"
)

// NewNVRTC returns the NVRTC of libgpu/cuda (libnvrtc loaded at run time).
// Nothing is loaded until the first call; without the library every call
// fails with an error wrapping cuda.ErrNoLibrary that names the library and
// GPUKIT_CUDA_PATH.
//
// Precompiled headers: when the library has the PCH API (CUDA 12.8+), each
// compilation adds "-pch" (automatic PCH, kept in NVRTC's in-process heap).
// When NVRTC reports the PCH heap exhausted, the compilation has still
// succeeded, only without a PCH; the heap is grown to the size NVRTC asked
// for so later compilations can use one. A compilation that fails for a
// reason other than the source (an option this NVRTC rejects) is retried once
// without -pch, and PCH is then left off.
func NewNVRTC() NVRTC { return &cudaNVRTC{} }

// NewNVRTCWithoutPCH is NewNVRTC with precompiled headers left off (for
// comparing compile times, and for NVRTC builds whose PCH misbehaves).
func NewNVRTCWithoutPCH() NVRTC { return &cudaNVRTC{pchOff: true} }

type cudaNVRTC struct {
	once   sync.Once
	pch    bool
	mu     sync.Mutex
	pchOff bool
}

func (n *cudaNVRTC) Version() (string, error) {
	ma, mi, err := cuda.NVRTCVersion()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d.%d", ma, mi), nil
}

func (n *cudaNVRTC) usePCH() bool {
	n.once.Do(func() {
		_, err := cuda.PCHHeapSize()
		n.pch = err == nil
	})
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pch && !n.pchOff
}

func (n *cudaNVRTC) Compile(j Job) (Output, error) {
	if n.usePCH() {
		out, sourceErr, err := n.compile(j, append(append([]string(nil), j.Flags...), "-pch"))
		if err == nil || sourceErr {
			return out, err
		}
		n.mu.Lock()
		n.pchOff = true
		n.mu.Unlock()
	}
	out, _, err := n.compile(j, j.Flags)
	return out, err
}

// compile runs one NVRTC program. sourceErr says the failure is the
// source's (NVRTC_ERROR_COMPILATION), not the options' or the library's.
func (n *cudaNVRTC) compile(j Job, flags []string) (out Output, sourceErr bool, err error) {
	prog, err := cuda.CreateProgram(string(j.Code), j.Name, j.Headers)
	if err != nil {
		return Output{}, false, err
	}
	defer prog.Destroy()
	for _, e := range j.NameExprs {
		if err := prog.AddNameExpression(e); err != nil {
			return Output{}, false, fmt.Errorf("name expression %q: %w", e, err)
		}
	}
	if err := prog.Compile(flags); err != nil {
		var ce *cuda.CompileError
		if errors.As(err, &ce) {
			if ce.Code == cuda.NVRTCErrorCompilation {
				return Output{Log: ce.Log}, true, fmt.Errorf("%w: %v", ErrCompile, ce.Code)
			}
			return Output{Log: ce.Log}, false, fmt.Errorf("nvrtc %v: %s", ce.Code, ce.Log)
		}
		return Output{}, false, err
	}
	out.Log, _ = prog.Log()
	out.Log = dropPCHNotes(out.Log)
	if j.PTX {
		out.Image, err = prog.PTX()
	} else {
		out.Image, err = prog.CUBIN()
	}
	if err != nil {
		return Output{}, false, err
	}
	if len(j.NameExprs) > 0 {
		out.Lowered = make(map[string]string, len(j.NameExprs))
		for _, e := range j.NameExprs {
			l, err := prog.LoweredName(e)
			if err != nil {
				return Output{}, false, fmt.Errorf("lowered name of %q: %w", e, err)
			}
			out.Lowered[e] = l
		}
	}
	if hasPCH(flags) && errors.Is(prog.PCHCreateStatus(), cuda.NVRTCErrorPCHHeapExhausted) {
		if need, err := prog.PCHHeapSizeRequired(); err == nil {
			if have, err := cuda.PCHHeapSize(); err == nil && need > have {
				_ = cuda.SetPCHHeapSize(need) // best effort: only later compilations gain
			}
		}
	}
	return out, false, nil
}

// dropPCHNotes removes the lines automatic PCH adds to every log
// (`"x.cu": creating precompiled header file "/tmp/..."`, "... using
// precompiled header ..."): they are not diagnostics about the source.
func dropPCHNotes(log string) string {
	if !strings.Contains(log, "precompiled header") {
		return log
	}
	var keep []string
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, "precompiled header") {
			keep = append(keep, l)
		}
	}
	return strings.TrimSpace(strings.Join(keep, "\n"))
}

func hasPCH(flags []string) bool {
	for _, f := range flags {
		if f == "-pch" {
			return true
		}
	}
	return false
}

// EmbeddedOptions are the options every embedded kernel is compiled with
// for arch, by the library at run time and by `kernelc build --libgpu`
// alike, so both use the same cache entries.
func EmbeddedOptions(arch string) Options { return Options{Arch: arch} }

// DeviceCompiler compiles the embedded kernels for one CUDA context and loads
// each module once per context.
type DeviceCompiler struct {
	*Compiler
	ctx  *cuda.Context
	arch string

	mu      sync.Mutex
	modules map[string]cuda.Module // embedded file name -> module in ctx
}

// NewDeviceCompiler returns a compiler bound to ctx, for the arch of ctx's
// device (Arch of its compute capability), over NVRTC and cache (nil: no
// cache). The context must be current on the calling thread when Module or
// Function is called (see libgpu/cuda: pin the goroutine).
func NewDeviceCompiler(ctx *cuda.Context, cache *Cache) (*DeviceCompiler, error) {
	ma, mi, err := ctx.Device().ComputeCapability()
	if err != nil {
		return nil, fmt.Errorf("kernels: device arch: %w", err)
	}
	return &DeviceCompiler{Compiler: NewCompiler(NewNVRTC(), cache), ctx: ctx, arch: Arch(ma, mi),
		modules: map[string]cuda.Module{}}, nil
}

// Arch is the target the compiler builds for ("sm_90a").
func (d *DeviceCompiler) Arch() string { return d.arch }

// Module returns the module of the embedded source name ("selftest.cu"),
// compiling it (or reading it from the cache) and loading it on first use;
// later calls return the same module.
func (d *DeviceCompiler) Module(name string) (cuda.Module, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m, ok := d.modules[name]; ok {
		return m, nil
	}
	src, err := Embedded(name)
	if err != nil {
		return 0, err
	}
	res, err := d.Compile(src, EmbeddedOptions(d.arch))
	if err != nil {
		return 0, err
	}
	m, err := cuda.ModuleLoadData(res.Cubin)
	if err != nil {
		return 0, fmt.Errorf("kernels: load %s (%s): %w", name, d.arch, err)
	}
	d.modules[name] = m
	return m, nil
}

// Function returns the kernel called kernel (its extern "C" name) of the
// embedded source file.
func (d *DeviceCompiler) Function(file, kernel string) (cuda.Function, error) {
	m, err := d.Module(file)
	if err != nil {
		return 0, err
	}
	f, err := m.Function(kernel)
	if err != nil {
		return 0, fmt.Errorf("kernels: %s in %s: %w", kernel, file, err)
	}
	return f, nil
}

var (
	perContextMu sync.Mutex
	perContext   = map[uintptr]*DeviceCompiler{}
)

// ForContext returns the process's DeviceCompiler for ctx, creating it on
// first use with the cache at DefaultCacheDir (no cache if that cannot be
// opened), so each embedded module is compiled or read once per process and
// loaded once per context.
func ForContext(ctx *cuda.Context) (*DeviceCompiler, error) {
	perContextMu.Lock()
	defer perContextMu.Unlock()
	if d := perContext[ctx.Handle()]; d != nil {
		return d, nil
	}
	var cache *Cache
	if dir, err := DefaultCacheDir(); err == nil {
		cache, _ = OpenCache(dir)
	}
	d, err := NewDeviceCompiler(ctx, cache)
	if err != nil {
		return nil, err
	}
	perContext[ctx.Handle()] = d
	return d, nil
}

// Close unloads every module the compiler loaded (the context must be
// current).
func (d *DeviceCompiler) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var first error
	for n, m := range d.modules {
		if err := m.Unload(); err != nil && first == nil {
			first = err
		}
		delete(d.modules, n)
	}
	return first
}
