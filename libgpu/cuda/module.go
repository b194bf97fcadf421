package cuda

import (
	"bytes"
	"runtime"
	"unsafe"
)

var (
	pModuleLoadData    = newProc(libDriver, "cuModuleLoadData")
	pModuleGetFunction = newProc(libDriver, "cuModuleGetFunction")
	pModuleUnload      = newProc(libDriver, "cuModuleUnload")
	pFuncGetAttribute  = newProc(libDriver, "cuFuncGetAttribute")
	pFuncSetAttribute  = newProc(libDriver, "cuFuncSetAttribute")
	pLaunchKernel      = newProc(libDriver, "cuLaunchKernel")
)

// Module is a CUmodule: a loaded cubin or PTX image.
type Module uintptr

var elfMagic = []byte{0x7f, 'E', 'L', 'F'}

// ModuleLoadData loads a cubin (ELF) or PTX image into the current context.
// PTX is JIT-compiled by the driver; a missing trailing NUL is added. The
// image is only read during the call.
func ModuleLoadData(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, badArg("ModuleLoadData with an empty image")
	}
	if !bytes.HasPrefix(image, elfMagic) && image[len(image)-1] != 0 {
		image = append(image[:len(image):len(image)], 0) // PTX text must end in NUL
	}
	var m uintptr
	if err := pModuleLoadData.cu(uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&image[0]))); err != nil {
		return 0, err
	}
	return Module(m), nil
}

// Function returns the kernel called name (the extern "C" name, or the
// lowered name from Program.LoweredName).
func (m Module) Function(name string) (Function, error) {
	c := cstr(name)
	var f uintptr
	if err := pModuleGetFunction.cu(uintptr(unsafe.Pointer(&f)), uintptr(m), uintptr(unsafe.Pointer(&c[0]))); err != nil {
		return 0, err
	}
	return Function(f), nil
}

// Unload unloads the module; its functions become invalid.
func (m Module) Unload() error { return pModuleUnload.cu(uintptr(m)) }

// Function is a CUfunction: one kernel of a loaded module.
type Function uintptr

// FunctionAttribute is a CUfunction_attribute.
type FunctionAttribute int32

// Function attributes (cuda.h).
const (
	FuncMaxThreadsPerBlock        FunctionAttribute = 0
	FuncSharedSizeBytes           FunctionAttribute = 1 // static shared memory
	FuncConstSizeBytes            FunctionAttribute = 2
	FuncLocalSizeBytes            FunctionAttribute = 3 // per thread (spills)
	FuncNumRegs                   FunctionAttribute = 4
	FuncPTXVersion                FunctionAttribute = 5 // 10*major+minor
	FuncBinaryVersion             FunctionAttribute = 6 // 10*major+minor
	FuncCacheModeCA               FunctionAttribute = 7
	FuncMaxDynamicSharedSizeBytes FunctionAttribute = 8 // settable
	FuncPreferredSharedCarveout   FunctionAttribute = 9 // settable, percent
)

// Attribute returns one property of the kernel.
func (f Function) Attribute(a FunctionAttribute) (int, error) {
	var v int32
	if err := pFuncGetAttribute.cu(uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(f)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// SetAttribute sets a settable property, e.g. FuncMaxDynamicSharedSizeBytes
// before a launch with more than 48 KiB of dynamic shared memory.
func (f Function) SetAttribute(a FunctionAttribute, v int) error {
	return pFuncSetAttribute.cu(uintptr(f), uintptr(a), uintptr(int32(v)))
}

// LaunchKernel queues f on s with grid×block threads and sharedMem bytes of
// dynamic shared memory. args holds one pointer per kernel parameter, to a
// value of exactly the parameter's type (cuLaunchKernel's kernelParams):
//
//	n := int32(len(x)); a := float32(2)
//	err := cuda.LaunchKernel(f, grid, block, 0, s,
//		unsafe.Pointer(&a), unsafe.Pointer(&xPtr), unsafe.Pointer(&yPtr), unsafe.Pointer(&n))
//
// The driver copies the values during the call (also when s is capturing),
// so they may change afterwards.
func LaunchKernel(f Function, grid, block [3]uint32, sharedMem uint32, s Stream, args ...unsafe.Pointer) error {
	if f == 0 {
		return badArg("LaunchKernel with a nil function")
	}
	// kernelParams is a void** that C reads: a Go array of Go pointers. The
	// array and every value it points to are pinned (runtime.Pinner) so they
	// stay alive and in place until the call returns; Pin also moves values
	// the caller took the address of onto the heap.
	var kp uintptr
	var pin runtime.Pinner
	defer pin.Unpin()
	if len(args) > 0 {
		params := make([]unsafe.Pointer, len(args))
		for i, a := range args {
			if a == nil {
				return badArg("LaunchKernel argument %d is a nil pointer", i)
			}
			pin.Pin(a)
			params[i] = a
		}
		pin.Pin(&params[0])
		kp = uintptr(unsafe.Pointer(&params[0])) // pinned above
	}
	return pLaunchKernel.cu(uintptr(f),
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
		uintptr(sharedMem), uintptr(s), kp, 0)
}
