// Package cuda owns the typed Go bindings to NVIDIA's CUDA libraries, loaded
// at run time with github.com/ebitengine/purego (dlopen, no cgo): the driver
// API (libcuda.so.1), NVRTC (libnvrtc.so.13/.12), cuBLASLt
// (libcublasLt.so.13/.12) and cuSOLVER's dense eigensolver
// (libcusolver.so.12/.11). Binaries build with CGO_ENABLED=0 on a machine
// without CUDA and start there; every call then returns an error that names
// the missing library. Nothing in this package panics.
//
// # Library lookup
//
// Each library is loaded once, on first use. The candidates, in order:
//
//  1. each directory of GPUKIT_CUDA_PATH (colon-separated), when set — an
//     explicit choice wins over whatever the system has;
//  2. the bare sonames, resolved by the dynamic loader (LD_LIBRARY_PATH,
//     ld.so.cache, RUNPATH);
//  3. the usual install directories: /usr/local/cuda/lib64,
//     /usr/local/cuda/targets/x86_64-linux/lib (sbsa-linux on arm64),
//     /usr/lib/x86_64-linux-gnu (aarch64-linux-gnu), /usr/lib64,
//     /usr/local/nvidia/lib64, $CONDA_PREFIX/lib, and the lib folders of
//     NVIDIA's pip wheels (python3*/{site,dist}-packages/nvidia/*/lib under
//     $VIRTUAL_ENV/lib, /usr/lib, /usr/local/lib, PREFIX/lib for every
//     PREFIX/bin on $PATH that holds a python3, and ~/.local/lib) — where
//     PyTorch's own copies live, NCCL's among them (nvidia/nccl/lib).
//
// Bindings outside this package (libgpu/nccl) load their libraries the same
// way through NewLibrary and Library.Proc.
//
// When none loads, the error is one line naming the library and
// GPUKIT_CUDA_PATH, and wraps ErrNoLibrary; a symbol missing from a loaded
// library gives an error that names the symbol and wraps ErrNoSymbol.
//
// # Errors
//
// Result (CUresult), NVRTCResult, BLASStatus and SolverStatus implement error with names
// compiled into the binary ("CUDA_ERROR_OUT_OF_MEMORY (2)"), so they read
// well even when the library is absent. Calls wrap them with the function
// name: errors.Is(err, cuda.ErrorOutOfMemory) works.
//
// # Threads and contexts
//
// A CUDA context is current per OS thread, and goroutines move between
// threads: an unpinned goroutine gets CUDA_ERROR_INVALID_CONTEXT (201). A
// goroutine that calls into this package pins itself with
// runtime.LockOSThread and makes its context current with
// (*Context).SetCurrent. The package keeps no launch state of its own:
// streams and handles are passed explicitly.
//
// # Memory handed to C
//
// Pointers to Go memory are passed only in the argument list of a
// //go:uintptrescapes call (so the compiler moves the object to the heap and
// keeps it alive for the call), or pinned with runtime.Pinner when they sit
// inside an array that C reads (kernel parameters, option lists).
package cuda
