// Package launch holds the typed launchers of libgpu/kernels: for every
// extern "C" __global__ kernel of libgpu/kernels/*.cu a Go function whose
// parameters have the Go types of the kernel's C parameters (pointers
// cuda.DevicePtr, int int32, long long int64, float float32, a struct a
// pointer to its generated Go struct), so an argument of the wrong type,
// or one missing, does not compile. The code is generated from the C
// declarations by gen.go (go generate; make lint checks it is current):
// x.cu gives x_cu.go. Kernels a macro instantiates from one template
// (add_##SUF: add_s_f32, add_v_bf16, ...) share one launcher that takes
// the instance ("s_f32") and refuses one the file does not define.
//
// A launcher queues its kernel through a Launcher, the runtime's CUDA
// backend (libgpu/exec), which looks the kernel up (compiling its unit on
// first use, libgpu/kernels), raises its shared-memory limit when asked
// for more than the default and launches it on the current stream. Kernel
// values name kernels for Prefetch.
package launch

//go:generate go run gen.go

import (
	"errors"
	"fmt"
	"unsafe"
)

// Kernel names one kernel: its embedded source file and extern "C" name.
type Kernel struct {
	File, Name string
}

func (k Kernel) String() string { return k.File + ":" + k.Name }

// Launcher queues a kernel: the runtime's CUDA backend implements it.
// args point to values of exactly the kernel's parameter types (the
// generated launchers build them).
type Launcher interface {
	Launch(k Kernel, grid, block [3]uint32, smem uint32, args ...unsafe.Pointer) error
}

// ErrNoInstance: a template launcher was given an instance its source
// file does not define.
var ErrNoInstance = errors.New("launch: no such kernel instance")

func errNoInstance(file, prefix, inst string) error {
	return fmt.Errorf("%w: %s%s in %s", ErrNoInstance, prefix, inst, file)
}

func errNilArgs(k Kernel) error {
	return fmt.Errorf("launch: %v: nil argument struct", k)
}

// Bool is a C int flag: 1 for true, 0 for false.
func Bool(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// All lists every kernel instance of libgpu/kernels/*.cu.
func All() []Kernel { return append([]Kernel(nil), all...) }
