package cuda

import (
	"errors"
	"fmt"
	"unsafe"
)

// ErrBadArg: an argument is out of range (negative size, nil pointer, ...).
var ErrBadArg = errors.New("cuda: bad argument")

func badArg(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadArg}, a...)...)
}

var (
	pMemAlloc        = newProc(libDriver, "cuMemAlloc_v2")
	pMemFree         = newProc(libDriver, "cuMemFree_v2")
	pMemcpyHtoD      = newProc(libDriver, "cuMemcpyHtoD_v2")
	pMemcpyDtoH      = newProc(libDriver, "cuMemcpyDtoH_v2")
	pMemcpyDtoD      = newProc(libDriver, "cuMemcpyDtoD_v2")
	pMemcpyHtoDAsync = newProc(libDriver, "cuMemcpyHtoDAsync_v2")
	pMemcpyDtoHAsync = newProc(libDriver, "cuMemcpyDtoHAsync_v2")
	pMemcpyDtoDAsync = newProc(libDriver, "cuMemcpyDtoDAsync_v2")
	pMemsetD8        = newProc(libDriver, "cuMemsetD8_v2")
	pMemsetD32       = newProc(libDriver, "cuMemsetD32_v2")
	pMemsetD32Async  = newProc(libDriver, "cuMemsetD32Async")
	pMemHostAlloc    = newProc(libDriver, "cuMemHostAlloc")
	pMemFreeHost     = newProc(libDriver, "cuMemFreeHost")
	pMemGetInfo      = newProc(libDriver, "cuMemGetInfo_v2")
)

// DevicePtr is a CUdeviceptr: an address in the unified virtual address
// space of the current context.
type DevicePtr uintptr

// Add returns p advanced by off bytes.
func (p DevicePtr) Add(off int64) DevicePtr { return p + DevicePtr(off) }

// MemAlloc allocates n bytes (n > 0) of device memory, 256-byte aligned, in
// the current context.
func MemAlloc(n int64) (DevicePtr, error) {
	if n <= 0 {
		return 0, badArg("MemAlloc size %d", n)
	}
	var p uint64
	if err := pMemAlloc.cu(uintptr(unsafe.Pointer(&p)), uintptr(n)); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// MemFree frees memory from MemAlloc.
func MemFree(p DevicePtr) error { return pMemFree.cu(uintptr(p)) }

func checkCopy(what string, n int64, ptrs ...bool) error {
	if n < 0 {
		return badArg("%s size %d", what, n)
	}
	for _, nonNil := range ptrs {
		if n > 0 && !nonNil {
			return badArg("%s with a nil pointer", what)
		}
	}
	return nil
}

// MemcpyHtoD copies n bytes from host memory at src to device memory at dst,
// synchronously. src must hold n bytes and stay valid during the call.
func MemcpyHtoD(dst DevicePtr, src unsafe.Pointer, n int64) error {
	if err := checkCopy("MemcpyHtoD", n, dst != 0, src != nil); err != nil || n == 0 {
		return err
	}
	return pMemcpyHtoD.cu(uintptr(dst), uintptr(src), uintptr(n))
}

// MemcpyDtoH copies n bytes from device memory at src to host memory at dst,
// synchronously.
func MemcpyDtoH(dst unsafe.Pointer, src DevicePtr, n int64) error {
	if err := checkCopy("MemcpyDtoH", n, dst != nil, src != 0); err != nil || n == 0 {
		return err
	}
	return pMemcpyDtoH.cu(uintptr(dst), uintptr(src), uintptr(n))
}

// MemcpyDtoD copies n bytes between device buffers.
func MemcpyDtoD(dst, src DevicePtr, n int64) error {
	if err := checkCopy("MemcpyDtoD", n, dst != 0, src != 0); err != nil || n == 0 {
		return err
	}
	return pMemcpyDtoD.cu(uintptr(dst), uintptr(src), uintptr(n))
}

// MemcpyHtoDAsync queues a host-to-device copy of n bytes on s. The copy is
// asynchronous only from pinned host memory (MemHostAlloc); src must stay
// valid until the copy has run, so never pass Go memory that may be freed.
func MemcpyHtoDAsync(dst DevicePtr, src unsafe.Pointer, n int64, s Stream) error {
	if err := checkCopy("MemcpyHtoDAsync", n, dst != 0, src != nil); err != nil || n == 0 {
		return err
	}
	return pMemcpyHtoDAsync.cu(uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

// MemcpyDtoHAsync queues a device-to-host copy of n bytes on s; dst must stay
// valid until the copy has run (use pinned memory).
func MemcpyDtoHAsync(dst unsafe.Pointer, src DevicePtr, n int64, s Stream) error {
	if err := checkCopy("MemcpyDtoHAsync", n, dst != nil, src != 0); err != nil || n == 0 {
		return err
	}
	return pMemcpyDtoHAsync.cu(uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

// MemcpyDtoDAsync queues a device-to-device copy of n bytes on s.
func MemcpyDtoDAsync(dst, src DevicePtr, n int64, s Stream) error {
	if err := checkCopy("MemcpyDtoDAsync", n, dst != 0, src != 0); err != nil || n == 0 {
		return err
	}
	return pMemcpyDtoDAsync.cu(uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

// MemsetD8 sets n bytes at p to v.
func MemsetD8(p DevicePtr, v uint8, n int64) error {
	if err := checkCopy("MemsetD8", n, p != 0); err != nil || n == 0 {
		return err
	}
	return pMemsetD8.cu(uintptr(p), uintptr(v), uintptr(n))
}

// MemsetD32 sets count 32-bit words at p (4-byte aligned) to v.
func MemsetD32(p DevicePtr, v uint32, count int64) error {
	if err := checkCopy("MemsetD32", count, p != 0); err != nil || count == 0 {
		return err
	}
	return pMemsetD32.cu(uintptr(p), uintptr(v), uintptr(count))
}

// MemsetD32Async queues MemsetD32 on s.
func MemsetD32Async(p DevicePtr, v uint32, count int64, s Stream) error {
	if err := checkCopy("MemsetD32Async", count, p != 0); err != nil || count == 0 {
		return err
	}
	return pMemsetD32Async.cu(uintptr(p), uintptr(v), uintptr(count), uintptr(s))
}

// memHostAllocPortable is CU_MEMHOSTALLOC_PORTABLE: pinned for every context.
const memHostAllocPortable = 1

// MemHostAlloc allocates n bytes of page-locked host memory, usable by every
// context (CU_MEMHOSTALLOC_PORTABLE). Free it with MemFreeHost; the Go GC
// does not know it.
func MemHostAlloc(n int64) (unsafe.Pointer, error) {
	if n <= 0 {
		return nil, badArg("MemHostAlloc size %d", n)
	}
	var p unsafe.Pointer // C writes a non-Go address here
	if err := pMemHostAlloc.cu(uintptr(unsafe.Pointer(&p)), uintptr(n), memHostAllocPortable); err != nil {
		return nil, err
	}
	return p, nil
}

// MemFreeHost frees memory from MemHostAlloc.
func MemFreeHost(p unsafe.Pointer) error { return pMemFreeHost.cu(uintptr(p)) }

// MemGetInfo returns the free and total device memory in bytes of the
// current context's device.
func MemGetInfo() (free, total int64, err error) {
	var f, t uint64
	if err := pMemGetInfo.cu(uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t))); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}
