package kernels

import "errors"

// Errors of this package. Wrapped with context; test with errors.Is.
var (
	// ErrCorrupt: a cache entry failed its header or sha256 check. The entry
	// has already been removed; treat it as a miss.
	ErrCorrupt = errors.New("kernels: corrupt cache entry")
	// ErrBadKey: a cache key is not 64 lower-case hex digits.
	ErrBadKey = errors.New("kernels: bad cache key")
	// ErrNoCacheDir: no cache directory could be derived from the environment.
	ErrNoCacheDir = errors.New("kernels: no cache directory (set GPUKIT_CACHE_DIR)")
	// ErrCompile: NVRTC rejected the source; the *CompileError carries the log.
	ErrCompile = errors.New("kernels: compilation failed")
	// ErrNoSource: no embedded kernel source has that name.
	ErrNoSource = errors.New("kernels: no such embedded source")
	// ErrBadArch: an architecture name is not of the form sm_XY[a] / compute_XY[a].
	ErrBadArch = errors.New("kernels: bad architecture")
	// ErrNotCubin: the bytes are not a CUDA ELF image (EM_CUDA).
	ErrNotCubin = errors.New("kernels: not a cubin")
	// ErrNoCompiler: the Compiler has no NVRTC behind it.
	ErrNoCompiler = errors.New("kernels: no NVRTC")
)
