package kernels

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
)

// Unit is what one compilation of an embedded source makes: the whole file
// File (Kernel ""), or, for a file whose kernels are marked with
// GPUKIT_KEEP (common.cuh; see Splittable), the one kernel Kernel of it,
// compiled with -DGPUKIT_ONLY=Kernel so NVRTC generates no other kernel's
// code.
type Unit struct {
	File   string // embedded source ("attention.cu")
	Kernel string // extern "C" kernel name, or "" for the whole file
}

func (u Unit) String() string {
	if u.Kernel == "" {
		return u.File
	}
	return u.File + ":" + u.Kernel
}

// Splittable reports whether a kernel source marks its kernels with
// GPUKIT_KEEP, so each can be compiled alone (Unit).
func Splittable(code []byte) bool { return bytes.Contains(code, []byte("GPUKIT_KEEP(")) }

var kernelNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CompileJobs is the number of compilations a Prefetcher runs at once:
// $GPUKIT_COMPILE_JOBS when it is a positive integer, else the number of
// CPUs Go may use (GOMAXPROCS).
func CompileJobs() int {
	if n, err := strconv.Atoi(os.Getenv("GPUKIT_COMPILE_JOBS")); err == nil && n > 0 {
		return n
	}
	return runtime.GOMAXPROCS(0)
}

// Prefetcher compiles units of the embedded kernel sources for one arch,
// through a Compiler and its cache, on a pool of workers: Prefetch queues
// the units a run will need and returns at once; Get returns a unit's
// result, waiting for its compilation when one is under way, or compiling
// it on the caller's goroutine when none has started (a unit asked for
// now does not wait behind the queue). Each unit compiles at most once per
// Prefetcher. NVRTC compiles distinct programs concurrently; kernelc
// build does the same. Safe for concurrent use.
type Prefetcher struct {
	comp   *Compiler
	arch   string
	source func(file string) (Source, error)
	sem    chan struct{}

	mu      sync.Mutex
	flights map[Unit]*flight
	sources map[string]Source
	whole   map[string]bool // splittable file -> its whole-file entry was cached when first asked
}

type flight struct {
	claimed atomic.Bool
	done    chan struct{}
	res     Result
	err     error
}

// NewPrefetcher returns a Prefetcher over comp for arch ("sm_90a") with
// workers compilations at once (at least 1), reading the embedded
// sources (Embedded).
func NewPrefetcher(comp *Compiler, arch string, workers int) *Prefetcher {
	return newPrefetcher(comp, arch, workers, Embedded)
}

func newPrefetcher(comp *Compiler, arch string, workers int, source func(string) (Source, error)) *Prefetcher {
	return &Prefetcher{comp: comp, arch: arch, source: source, sem: make(chan struct{}, max(1, workers)),
		flights: map[Unit]*flight{}, sources: map[string]Source{}, whole: map[string]bool{}}
}

func (p *Prefetcher) src(file string) (Source, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.sources[file]; ok {
		return s, nil
	}
	s, err := p.source(file)
	if err != nil {
		return Source{}, err
	}
	p.sources[file] = s
	return s, nil
}

// Options are the compile options of u: EmbeddedOptions(arch), plus
// GPUKIT_ONLY=Kernel for a single kernel.
func (p *Prefetcher) Options(u Unit) Options {
	o := EmbeddedOptions(p.arch)
	if u.Kernel != "" {
		o.Defines = []string{"GPUKIT_ONLY=" + u.Kernel}
	}
	return o
}

// Unit is the unit that provides kernel of file: the whole file unless
// the file is Splittable and its whole-file entry was not in the cache
// when the file was first asked for (kernelc build --libgpu writes whole
// files, so a warmed cache is used as it is). A kernel of "" is the whole
// file.
func (p *Prefetcher) Unit(file, kernel string) (Unit, error) {
	src, err := p.src(file)
	if err != nil {
		return Unit{}, err
	}
	if kernel == "" || !Splittable(src.Code) {
		return Unit{File: file}, nil
	}
	if !kernelNameRE.MatchString(kernel) {
		return Unit{}, fmt.Errorf("kernels: %q is not a kernel name", kernel)
	}
	p.mu.Lock()
	w, ok := p.whole[file]
	p.mu.Unlock()
	if !ok {
		w, _ = p.comp.Cached(src, p.Options(Unit{File: file}))
		p.mu.Lock()
		if prev, ok := p.whole[file]; ok {
			w = prev
		} else {
			p.whole[file] = w
		}
		p.mu.Unlock()
	}
	if w {
		return Unit{File: file}, nil
	}
	return Unit{File: file, Kernel: kernel}, nil
}

// Prefetch queues the compilation of the units that provide kernels of
// file (Unit; no kernels: the whole file) and returns without waiting.
// Errors are not reported here: Get reports them when the unit is asked
// for.
func (p *Prefetcher) Prefetch(file string, kernels ...string) {
	if len(kernels) == 0 {
		kernels = []string{""}
	}
	for _, k := range kernels {
		u, err := p.Unit(file, k)
		if err != nil {
			continue
		}
		f, fresh := p.flight(u)
		if !fresh {
			continue
		}
		go func() {
			p.sem <- struct{}{}
			defer func() { <-p.sem }()
			p.run(u, f)
		}()
	}
}

// flight returns u's flight, made now (fresh) if there was none.
func (p *Prefetcher) flight(u Unit) (f *flight, fresh bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.flights[u]; f != nil {
		return f, false
	}
	f = &flight{done: make(chan struct{})}
	p.flights[u] = f
	return f, true
}

// run compiles u into f unless another goroutine has claimed it.
func (p *Prefetcher) run(u Unit, f *flight) {
	if !f.claimed.CompareAndSwap(false, true) {
		return
	}
	defer close(f.done)
	src, err := p.src(u.File)
	if err != nil {
		f.err = err
		return
	}
	f.res, f.err = p.comp.Compile(src, p.Options(u))
}

// Get returns u's compilation: the result of a queued or running one, or
// of one made now on the caller's goroutine.
func (p *Prefetcher) Get(u Unit) (Result, error) {
	f, _ := p.flight(u)
	p.run(u, f) // does nothing when a worker has claimed it
	<-f.done
	return f.res, f.err
}

// Started reports whether u has been queued or compiled by this
// Prefetcher.
func (p *Prefetcher) Started(u Unit) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flights[u] != nil
}

// Forget drops u's result (after its module is loaded, to free the
// image); a later Get compiles it again (a cache hit).
func (p *Prefetcher) Forget(u Unit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.flights[u]; f != nil {
		select {
		case <-f.done:
			delete(p.flights, u)
		default:
		}
	}
}
