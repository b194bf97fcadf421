package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// Sentinels wrapped by the loader's errors.
var (
	// ErrNoLibrary: a CUDA library could not be found or loaded.
	ErrNoLibrary = errors.New("cuda: library not found")
	// ErrNoSymbol: a loaded library lacks a function (an older version).
	ErrNoSymbol = errors.New("cuda: symbol not found")
)

// EnvCUDAPath names the environment variable with extra directories
// (colon-separated) searched first for the CUDA libraries.
const EnvCUDAPath = "GPUKIT_CUDA_PATH"

// LibraryError says which library could not be loaded. It wraps ErrNoLibrary.
type LibraryError struct {
	// Pkg prefixes the message: "cuda" for this package's libraries,
	// "nccl" for libgpu/nccl's (see NewLibrary); empty reads "cuda".
	Pkg   string
	Lib   string   // the first soname, e.g. "libcuda.so.1"
	Hint  string   // what is probably missing, e.g. "no NVIDIA driver?"
	Tried []string // every candidate tried, in order
	// Cause is the loader's message for a candidate that exists but failed
	// to load (wrong architecture, missing dependency); empty when none
	// was found at all.
	Cause string
}

func (e *LibraryError) Error() string {
	pkg := e.Pkg
	if pkg == "" {
		pkg = "cuda"
	}
	if e.Cause != "" {
		return fmt.Sprintf("%s: %s could not be loaded (%s); set %s to the directory that holds a working one",
			pkg, e.Lib, oneLine(e.Cause), EnvCUDAPath)
	}
	return fmt.Sprintf("%s: %s not found (%s); set %s to the directory that holds it", pkg, e.Lib, e.Hint, EnvCUDAPath)
}

// Unwrap makes errors.Is(err, ErrNoLibrary) true.
func (e *LibraryError) Unwrap() error { return ErrNoLibrary }

// SymbolError says which function a loaded library lacks. It wraps ErrNoSymbol.
type SymbolError struct {
	Lib, Symbol string
}

func (e *SymbolError) Error() string {
	return fmt.Sprintf("cuda: symbol %s not found in %s (library too old?)", e.Symbol, e.Lib)
}

// Unwrap makes errors.Is(err, ErrNoSymbol) true.
func (e *SymbolError) Unwrap() error { return ErrNoSymbol }

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// library is one shared object, loaded lazily once.
type library struct {
	names []string // sonames, most preferred first
	hint  string
	pkg   string // LibraryError.Pkg

	once   sync.Once
	handle uintptr
	path   string
	err    error
}

var (
	libDriver = &library{names: []string{"libcuda.so.1", "libcuda.so"}, hint: "no NVIDIA driver?"}
	libNVRTC  = &library{names: []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"},
		hint: "CUDA toolkit's NVRTC not installed?"}
	libBLASLt = &library{names: []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"},
		hint: "CUDA toolkit's cuBLASLt not installed?"}
)

// searchDirs lists the usual install directories, after GPUKIT_CUDA_PATH and
// the bare sonames. Tests replace it.
var searchDirs = defaultSearchDirs

func defaultSearchDirs() []string {
	triple, target := "x86_64-linux-gnu", "x86_64-linux"
	if runtime.GOARCH == "arm64" {
		triple, target = "aarch64-linux-gnu", "sbsa-linux"
	}
	dirs := []string{
		"/usr/local/cuda/lib64",
		"/usr/local/cuda/targets/" + target + "/lib",
		"/usr/lib/" + triple,
		"/usr/lib64",
		"/usr/local/nvidia/lib64",
	}
	// Conda installs the libraries (NCCL too) into $CONDA_PREFIX/lib.
	if c := os.Getenv("CONDA_PREFIX"); c != "" {
		dirs = append(dirs, filepath.Join(c, "lib"))
	}
	// NVIDIA's pip wheels: site-packages/nvidia/<component>/lib (NCCL:
	// nvidia/nccl/lib, from PyTorch's nvidia-nccl-cu* dependency).
	roots := []string{"/usr/lib", "/usr/local/lib"}
	if v := os.Getenv("VIRTUAL_ENV"); v != "" {
		roots = append([]string{filepath.Join(v, "lib")}, roots...)
	}
	roots = append(roots, pythonRoots(os.Getenv("PATH"))...)
	if h, err := os.UserHomeDir(); err == nil {
		roots = append(roots, filepath.Join(h, ".local/lib"))
	}
	seen := map[string]bool{}
	for _, r := range roots {
		if seen[r] {
			continue
		}
		seen[r] = true
		for _, pk := range []string{"site-packages", "dist-packages"} {
			m, _ := filepath.Glob(filepath.Join(r, "python3*", pk, "nvidia", "*", "lib"))
			dirs = append(dirs, m...)
		}
	}
	return dirs
}

// pythonRoots returns PREFIX/lib for every directory PREFIX/bin of path
// (colon-separated, as $PATH) that holds a python3: the environment whose
// python3 a user runs (a virtual environment such as /opt/torch/.venv,
// conda, pyenv) keeps PyTorch's NVIDIA wheels under
// PREFIX/lib/python3*/site-packages. The bin directory is taken as found
// on the path, not through python3's symbolic link, which in a virtual
// environment leads out of it.
func pythonRoots(path string) []string {
	var out []string
	for _, d := range filepath.SplitList(path) {
		if d == "" || !filepath.IsAbs(d) {
			continue
		}
		if fi, err := os.Stat(filepath.Join(d, "python3")); err != nil || fi.IsDir() {
			continue
		}
		out = append(out, filepath.Join(filepath.Dir(filepath.Clean(d)), "lib"))
	}
	return out
}

// candidates returns what load tries, in order: GPUKIT_CUDA_PATH dirs,
// bare sonames, then the usual directories.
func (l *library) candidates() []string {
	var out []string
	if env := os.Getenv(EnvCUDAPath); env != "" {
		for _, d := range filepath.SplitList(env) {
			if d == "" {
				continue
			}
			for _, n := range l.names {
				out = append(out, filepath.Join(d, n))
			}
		}
	}
	out = append(out, l.names...)
	for _, d := range searchDirs() {
		for _, n := range l.names {
			out = append(out, filepath.Join(d, n))
		}
	}
	return out
}

func (l *library) load() error {
	l.once.Do(func() {
		e := &LibraryError{Pkg: l.pkg, Lib: l.names[0], Hint: l.hint}
		for _, c := range l.candidates() {
			e.Tried = append(e.Tried, c)
			abs := strings.ContainsRune(c, '/')
			if abs {
				if _, err := os.Stat(c); err != nil {
					continue
				}
			}
			h, err := purego.Dlopen(c, purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err == nil {
				l.handle, l.path = h, c
				return
			}
			if abs && e.Cause == "" {
				e.Cause = err.Error()
			}
		}
		l.err = e
	})
	return l.err
}

// proc is one function of a library, looked up lazily once. names holds the
// preferred symbol first and older fallbacks after it.
type proc struct {
	lib   *library
	names []string

	once sync.Once
	addr uintptr
	err  error
}

func newProc(l *library, names ...string) *proc { return &proc{lib: l, names: names} }

func (p *proc) find() (uintptr, error) {
	p.once.Do(func() {
		if err := p.lib.load(); err != nil {
			p.err = err
			return
		}
		for _, n := range p.names {
			if a, err := purego.Dlsym(p.lib.handle, n); err == nil && a != 0 {
				p.addr = a
				return
			}
		}
		p.err = &SymbolError{Lib: filepath.Base(p.lib.path), Symbol: p.names[0]}
	})
	return p.addr, p.err
}

// call invokes the C function. Pointers converted to uintptr in the argument
// list of a call to call (or to the wrappers below) are moved to the heap and
// kept alive until the call returns.
//
//go:uintptrescapes
func (p *proc) call(args ...uintptr) (uintptr, error) {
	fn, err := p.find()
	if err != nil {
		return 0, err
	}
	r, _, _ := purego.SyscallN(fn, args...)
	return r, nil
}

// cu calls a driver function and turns its CUresult into an error.
//
//go:uintptrescapes
func (p *proc) cu(args ...uintptr) error {
	r, err := p.call(args...)
	if err != nil {
		return err
	}
	if res := Result(int32(r)); res != Success {
		return &CallError{Func: p.names[0], Err: res}
	}
	return nil
}

// nvrtc calls an NVRTC function and turns its nvrtcResult into an error.
//
//go:uintptrescapes
func (p *proc) nvrtc(args ...uintptr) error {
	r, err := p.call(args...)
	if err != nil {
		return err
	}
	if res := NVRTCResult(int32(r)); res != NVRTCSuccess {
		return &CallError{Func: p.names[0], Err: res}
	}
	return nil
}

// blas calls a cuBLASLt function and turns its cublasStatus_t into an error.
//
//go:uintptrescapes
func (p *proc) blas(args ...uintptr) error {
	r, err := p.call(args...)
	if err != nil {
		return err
	}
	if st := BLASStatus(int32(r)); st != BLASStatusSuccess {
		return &CallError{Func: p.names[0], Err: st}
	}
	return nil
}

// CallError is a failed library call: the C function's name and its result
// (a Result, NVRTCResult or BLASStatus), which errors.Is and errors.As see.
type CallError struct {
	Func string
	Err  error
}

func (e *CallError) Error() string { return "cuda: " + e.Func + ": " + e.Err.Error() }

// Unwrap returns the result code.
func (e *CallError) Unwrap() error { return e.Err }

// Library is a shared library outside this package's own (libgpu/nccl's
// libnccl.so.2), found with this package's search order (see the package
// documentation) and loaded once, on first use. Its errors are this
// package's: a LibraryError (wrapping ErrNoLibrary) prefixed with the
// binding's package name, and SymbolError.
type Library struct{ l *library }

// NewLibrary describes a library: pkg prefixes its errors ("nccl"), hint
// says what is probably missing when no candidate is found, names are its
// sonames, most preferred first ("libnccl.so.2", "libnccl.so"). Nothing is
// loaded until a Proc is called or Load.
func NewLibrary(pkg, hint string, names ...string) *Library {
	return &Library{l: &library{names: names, hint: hint, pkg: pkg}}
}

// Load loads the library (once; later calls return the first error).
func (l *Library) Load() error { return l.l.load() }

// Path is the candidate that loaded ("" before a successful Load).
func (l *Library) Path() string {
	if l.l.load() != nil {
		return ""
	}
	return l.l.path
}

// Proc is one C function of a Library, looked up on its first call.
type Proc struct{ p *proc }

// Proc returns the function named by the first of names the library has
// (later names are older fallbacks).
func (l *Library) Proc(names ...string) *Proc { return &Proc{p: newProc(l.l, names...)} }

// Find loads the library and looks the function up; the error names what
// is missing.
func (p *Proc) Find() error {
	_, err := p.p.find()
	return err
}

// Call invokes the C function with integer and pointer arguments (at most
// 15, as purego.SyscallN) and returns its integer result (C's int results
// in the low 32 bits). As with this package's own calls, a Go pointer
// converted to uintptr in Call's argument list is kept alive and unmoved
// for the call.
//
//go:uintptrescapes
func (p *Proc) Call(args ...uintptr) (uintptr, error) { return p.p.call(args...) }
