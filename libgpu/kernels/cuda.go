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
	// heap: compilations hold it shared; growing the PCH heap (a
	// process-wide NVRTC setting) holds it alone, between compilations.
	heap sync.RWMutex
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

// compile runs one NVRTC program (growing the PCH heap afterwards when it
// asked for more). sourceErr says the failure is the source's
// (NVRTC_ERROR_COMPILATION), not the options' or the library's.
func (n *cudaNVRTC) compile(j Job, flags []string) (out Output, sourceErr bool, err error) {
	n.heap.RLock()
	out, need, sourceErr, err := n.program(j, flags)
	n.heap.RUnlock()
	if need > 0 {
		n.heap.Lock()
		if have, err := cuda.PCHHeapSize(); err == nil && need > have {
			_ = cuda.SetPCHHeapSize(need) // best effort: only later compilations gain
		}
		n.heap.Unlock()
	}
	return out, sourceErr, err
}

// program compiles one NVRTC program; need is the PCH heap it asked for
// when automatic PCH found the heap exhausted (else 0).
func (n *cudaNVRTC) program(j Job, flags []string) (out Output, need int64, sourceErr bool, err error) {
	prog, err := cuda.CreateProgram(string(j.Code), j.Name, j.Headers)
	if err != nil {
		return Output{}, 0, false, err
	}
	defer prog.Destroy()
	for _, e := range j.NameExprs {
		if err := prog.AddNameExpression(e); err != nil {
			return Output{}, 0, false, fmt.Errorf("name expression %q: %w", e, err)
		}
	}
	if err := prog.Compile(flags); err != nil {
		var ce *cuda.CompileError
		if errors.As(err, &ce) {
			if ce.Code == cuda.NVRTCErrorCompilation {
				return Output{Log: ce.Log}, 0, true, fmt.Errorf("%w: %v", ErrCompile, ce.Code)
			}
			return Output{Log: ce.Log}, 0, false, fmt.Errorf("nvrtc %v: %s", ce.Code, ce.Log)
		}
		return Output{}, 0, false, err
	}
	out.Log, _ = prog.Log()
	out.Log = dropPCHNotes(out.Log)
	if j.PTX {
		out.Image, err = prog.PTX()
	} else {
		out.Image, err = prog.CUBIN()
	}
	if err != nil {
		return Output{}, 0, false, err
	}
	if len(j.NameExprs) > 0 {
		out.Lowered = make(map[string]string, len(j.NameExprs))
		for _, e := range j.NameExprs {
			l, err := prog.LoweredName(e)
			if err != nil {
				return Output{}, 0, false, fmt.Errorf("lowered name of %q: %w", e, err)
			}
			out.Lowered[e] = l
		}
	}
	if hasPCH(flags) && errors.Is(prog.PCHCreateStatus(), cuda.NVRTCErrorPCHHeapExhausted) {
		if n, err := prog.PCHHeapSizeRequired(); err == nil {
			need = n
		}
	}
	return out, need, false, nil
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
// each compiled unit (Unit: a whole file, or one kernel of a Splittable
// file) once per context. Compilations run on a Prefetcher: Prefetch
// queues what a run will need on a pool of CompileJobs workers, so kernels
// compile in parallel, and only those asked for, while the run sets up.
type DeviceCompiler struct {
	*Compiler
	ctx  *cuda.Context
	arch string
	pre  *Prefetcher

	mu      sync.Mutex
	modules map[Unit]cuda.Module // loaded in ctx
}

// NewDeviceCompiler returns a compiler bound to ctx, for the arch of ctx's
// device (Arch of its compute capability), over NVRTC and cache (nil: no
// cache), compiling CompileJobs units at once. The context must be current
// on the calling thread when Module, Function or Has is called (see
// libgpu/cuda: pin the goroutine); Prefetch may be called from any thread.
func NewDeviceCompiler(ctx *cuda.Context, cache *Cache) (*DeviceCompiler, error) {
	ma, mi, err := ctx.Device().ComputeCapability()
	if err != nil {
		return nil, fmt.Errorf("kernels: device arch: %w", err)
	}
	comp := NewCompiler(NewNVRTC(), cache)
	arch := Arch(ma, mi)
	return &DeviceCompiler{Compiler: comp, ctx: ctx, arch: arch, pre: NewPrefetcher(comp, arch, CompileJobs()),
		modules: map[Unit]cuda.Module{}}, nil
}

// Arch is the target the compiler builds for ("sm_90a").
func (d *DeviceCompiler) Arch() string { return d.arch }

// Prefetch starts compiling, in the background, the units that provide
// kernels of the embedded file (no kernels: the whole file); it returns at
// once. Units already loaded or queued are skipped. Errors surface when
// the kernel is asked for (Function).
func (d *DeviceCompiler) Prefetch(file string, kernels ...string) {
	if len(kernels) == 0 {
		kernels = []string{""}
	}
	for _, k := range kernels {
		u, err := d.pre.Unit(file, k)
		if err != nil {
			continue
		}
		d.mu.Lock()
		_, loaded := d.modules[u]
		_, whole := d.modules[Unit{File: file}]
		d.mu.Unlock()
		if !loaded && !whole {
			d.pre.Prefetch(file, k)
		}
	}
}

// Prefetched reports whether what provides kernel of file is loaded, or
// was queued or compiled by Prefetch or an earlier Function, so a first
// launch that finds it false waited for a compilation nobody had started.
func (d *DeviceCompiler) Prefetched(file, kernel string) bool {
	u, err := d.pre.Unit(file, kernel)
	if err != nil {
		return false
	}
	d.mu.Lock()
	_, loaded := d.modules[u]
	_, whole := d.modules[Unit{File: file}]
	d.mu.Unlock()
	return loaded || whole || d.pre.Started(u)
}

// Module returns the module of the whole embedded source name
// ("selftest.cu"), compiling it (or reading it from the cache) and loading
// it on first use; later calls return the same module.
func (d *DeviceCompiler) Module(name string) (cuda.Module, error) {
	return d.load(Unit{File: name})
}

// load returns u's module, compiling (or waiting for the Prefetcher) and
// loading it on first use.
func (d *DeviceCompiler) load(u Unit) (cuda.Module, error) {
	d.mu.Lock()
	m, ok := d.modules[u]
	d.mu.Unlock()
	if ok {
		return m, nil
	}
	if _, err := d.pre.src(u.File); err != nil {
		return 0, err
	}
	res, err := d.pre.Get(u)
	if err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if m, ok := d.modules[u]; ok {
		return m, nil
	}
	m, err = cuda.ModuleLoadData(res.Cubin)
	if err != nil {
		return 0, fmt.Errorf("kernels: load %s (%s): %w", u, d.arch, err)
	}
	d.modules[u] = m
	d.pre.Forget(u)
	return m, nil
}

// unitModule returns the module that holds kernel of file: the whole
// file's when it is loaded, else that of the unit that provides it.
func (d *DeviceCompiler) unitModule(file, kernel string) (cuda.Module, error) {
	d.mu.Lock()
	m, ok := d.modules[Unit{File: file}]
	d.mu.Unlock()
	if ok {
		return m, nil
	}
	u, err := d.pre.Unit(file, kernel)
	if err != nil {
		return 0, err
	}
	return d.load(u)
}

// Function returns the kernel called kernel (its extern "C" name) of the
// embedded source file, compiling and loading what provides it on first
// use (for a Splittable file, that kernel alone unless the whole file is
// cached or loaded).
func (d *DeviceCompiler) Function(file, kernel string) (cuda.Function, error) {
	m, err := d.unitModule(file, kernel)
	if err != nil {
		return 0, err
	}
	f, err := m.Function(kernel)
	if err != nil {
		return 0, fmt.Errorf("kernels: %s in %s: %w", kernel, file, err)
	}
	return f, nil
}

// Has reports whether the embedded source file defines kernel for this
// device's arch (a kernel a file defines only under some #if is absent
// elsewhere); errors are compile and load failures.
func (d *DeviceCompiler) Has(file, kernel string) (bool, error) {
	m, err := d.unitModule(file, kernel)
	if err != nil {
		return false, err
	}
	_, err = m.Function(kernel)
	return err == nil, nil
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
	for u, m := range d.modules {
		if err := m.Unload(); err != nil && first == nil {
			first = err
		}
		delete(d.modules, u)
	}
	return first
}
