package nccl

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"gpukit/libgpu/cuda"
)

// EnvNVLS is NCCL's switch for NVLink SHARP (multicast objects made with
// cuMulticastCreate). This package sets it to 0 before NCCL is first
// called unless the environment already sets it: on the shared GPU hosts
// gpukit is tested on, a program that uses NVLink multicast can put the
// host's GPUs out of service.
const EnvNVLS = "NCCL_NVLS_ENABLE"

// MinVersion is the oldest NCCL this package drives: 2.23, the first with
// ncclCommInitRankScalable, which takes the unique id by pointer.
// ncclCommInitRank takes its 128-byte ncclUniqueId by value, which the
// System V amd64 ABI passes in 16 stack slots; purego passes at most 9
// (15 arguments, 6 in registers), so it cannot be called without cgo.
const MinVersion Version = 22300

// ErrTooOld: the NCCL that loaded is older than MinVersion.
var ErrTooOld = errors.New("nccl: library too old")

var libNCCL = cuda.NewLibrary("nccl",
	"NCCL not installed? PyTorch's wheels carry it (site-packages/nvidia/nccl/lib), so does NVIDIA's libnccl2 package",
	"libnccl.so.2", "libnccl.so")

var (
	pGetVersion           = libNCCL.Proc("ncclGetVersion")
	pGetUniqueID          = libNCCL.Proc("ncclGetUniqueId")
	pCommInitRankScalable = libNCCL.Proc("ncclCommInitRankScalable")
	pCommFinalize         = libNCCL.Proc("ncclCommFinalize")
	pCommDestroy          = libNCCL.Proc("ncclCommDestroy")
	pCommAbort            = libNCCL.Proc("ncclCommAbort")
	pCommGetAsyncError    = libNCCL.Proc("ncclCommGetAsyncError")
	pCommCount            = libNCCL.Proc("ncclCommCount")
	pCommUserRank         = libNCCL.Proc("ncclCommUserRank")
	pGetErrorString       = libNCCL.Proc("ncclGetErrorString")
	pGetLastError         = libNCCL.Proc("ncclGetLastError")
	pAllReduce            = libNCCL.Proc("ncclAllReduce")
	pBroadcast            = libNCCL.Proc("ncclBroadcast")
	pAllGather            = libNCCL.Proc("ncclAllGather")
	pReduceScatter        = libNCCL.Proc("ncclReduceScatter")
	pGroupStart           = libNCCL.Proc("ncclGroupStart")
	pGroupEnd             = libNCCL.Proc("ncclGroupEnd")
)

var (
	loadOnce sync.Once
	loadErr  error
	version  Version
)

// load sets NCCL_NVLS_ENABLE=0 when unset (os.Setenv reaches the C
// environment NCCL reads: purego's runtime hooks setenv), loads NCCL and
// checks its version, once per process.
func load() error {
	loadOnce.Do(func() {
		if v, ok := os.LookupEnv(EnvNVLS); !ok || v == "" {
			os.Setenv(EnvNVLS, "0")
		}
		var v int32
		r, err := pGetVersion.Call(uintptr(unsafe.Pointer(&v)))
		if err != nil {
			loadErr = err
			return
		}
		if res := Result(int32(r)); res != Success {
			loadErr = &CallError{Func: "ncclGetVersion", Err: res}
			return
		}
		version = Version(v)
		if version < MinVersion {
			loadErr = fmt.Errorf("%w: NCCL %v at %s; gpukit needs %v or later (ncclCommInitRankScalable)",
				ErrTooOld, version, libNCCL.Path(), MinVersion)
		}
	})
	return loadErr
}

// Available reports whether NCCL loads here and is recent enough.
func Available() bool { return load() == nil }

// LibraryVersion loads NCCL (see Available) and returns its version.
func LibraryVersion() (Version, error) {
	if err := load(); err != nil {
		return version, err
	}
	return version, nil
}

// LibraryPath is the file NCCL was loaded from ("" when it was not).
func LibraryPath() string {
	if load() != nil && version == 0 {
		return ""
	}
	return libNCCL.Path()
}

// call calls an NCCL function that returns ncclResult_t, after load, and
// turns a failure into a CallError carrying ncclGetLastError's text.
//
//go:uintptrescapes
func call(p *cuda.Proc, name string, args ...uintptr) error {
	if err := load(); err != nil {
		return err
	}
	r, err := p.Call(args...)
	if err != nil {
		return err
	}
	if res := Result(int32(r)); res != Success {
		return &CallError{Func: name, Err: res, Detail: describe(res)}
	}
	return nil
}

// describe is NCCL's text for a failure: ncclGetLastError's message of the
// calling thread's last error, else ncclGetErrorString's for the code.
func describe(res Result) string {
	if s := lastError(); s != "" {
		return s
	}
	r, err := pGetErrorString.Call(uintptr(res))
	if err != nil {
		return ""
	}
	return cString(r, 512)
}

// lastError is ncclGetLastError(NULL): NCCL's message for the last error
// of the calling thread, or "" when the library lacks it.
func lastError() string {
	r, err := pGetLastError.Call(0)
	if err != nil {
		return ""
	}
	return cString(r, 512)
}

// cString copies the NUL-terminated C string at p (at most max bytes).
func cString(p uintptr, max int) string {
	if p == 0 {
		return ""
	}
	// p is C memory, not Go memory: reinterpreting the integer as a
	// pointer is valid (the Go garbage collector never moves or frees it).
	base := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	var b []byte
	for i := 0; i < max; i++ {
		c := *(*byte)(unsafe.Add(base, i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// Version is NCCL_VERSION_CODE: major·10000 + minor·100 + patch for 2.9 and
// later (major·1000 + minor·100 + patch before; nccl.h's NCCL_VERSION).
type Version int

// Parts splits the code into major, minor and patch.
func (v Version) Parts() (major, minor, patch int) {
	c := int(v)
	if c >= 10000 {
		return c / 10000, c % 10000 / 100, c % 100
	}
	return c / 1000, c % 1000 / 100, c % 100
}

func (v Version) String() string {
	a, b, c := v.Parts()
	return fmt.Sprintf("%d.%d.%d", a, b, c)
}
