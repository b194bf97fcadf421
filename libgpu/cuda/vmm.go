package cuda

import (
	"encoding/binary"
	"runtime"
	"unsafe"
)

var (
	pMemGetGranularity = newProc(libDriver, "cuMemGetAllocationGranularity")
	pMemCreate         = newProc(libDriver, "cuMemCreate")
	pMemExport         = newProc(libDriver, "cuMemExportToShareableHandle")
	pMemImport         = newProc(libDriver, "cuMemImportFromShareableHandle")
	pMemAddressReserve = newProc(libDriver, "cuMemAddressReserve")
	pMemAddressFree    = newProc(libDriver, "cuMemAddressFree")
	pMemMap            = newProc(libDriver, "cuMemMap")
	pMemSetAccess      = newProc(libDriver, "cuMemSetAccess")
	pMemUnmap          = newProc(libDriver, "cuMemUnmap")
	pMemRelease        = newProc(libDriver, "cuMemRelease")

	pIpcGetMemHandle   = newProc(libDriver, "cuIpcGetMemHandle")
	pIpcOpenMemHandle  = newProc(libDriver, "cuIpcOpenMemHandle_v2")
	pIpcCloseMemHandle = newProc(libDriver, "cuIpcCloseMemHandle")
	pIpcGetEventHandle = newProc(libDriver, "cuIpcGetEventHandle")
	pIpcOpenEvtHandle  = newProc(libDriver, "cuIpcOpenEventHandle")
)

// Enumerators from cuda.h used by the VMM calls.
const (
	memAllocationTypePinned      = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	memHandleTypePosixFD         = 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	memLocationTypeDevice        = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	memAccessProtReadWrite       = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	memAllocGranularityMinimum   = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	memAllocGranularityRecommend = 1 // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
	ipcMemLazyEnablePeerAccess   = 1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
)

// memLocation mirrors CUmemLocation (cuda.h, unchanged from CUDA 10.2 to
// 13.0): { CUmemLocationType type; int id; } — 8 bytes, type at 0, id at 4.
type memLocation struct {
	Type int32
	ID   int32
}

// memAllocationProp mirrors CUmemAllocationProp (32 bytes on LP64):
//
//	offset  0  int32   type                  (CUmemAllocationType)
//	offset  4  int32   requestedHandleTypes  (CUmemAllocationHandleType)
//	offset  8  8 bytes location              (CUmemLocation)
//	offset 16  ptr     win32HandleMetaData
//	offset 24  uint8   allocFlags.compressionType
//	offset 25  uint8   allocFlags.gpuDirectRDMACapable
//	offset 26  uint16  allocFlags.usage
//	offset 28  [4]byte allocFlags.reserved
type memAllocationProp struct {
	Type                 int32
	RequestedHandleTypes int32
	Location             memLocation
	Win32HandleMetaData  uintptr
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// memAccessDesc mirrors CUmemAccessDesc (12 bytes): location at 0, flags
// (CUmemAccess_flags) at 8.
type memAccessDesc struct {
	Location memLocation
	Flags    int32
}

func deviceProp(d Device) memAllocationProp {
	return memAllocationProp{
		Type:                 memAllocationTypePinned,
		RequestedHandleTypes: memHandleTypePosixFD,
		Location:             memLocation{Type: memLocationTypeDevice, ID: int32(d)},
	}
}

// MemHandle is a CUmemGenericAllocationHandle: physical memory from
// MemCreate or MemImportFromFD, mapped into an address range with MemMap.
type MemHandle uint64

// MemGetAllocationGranularity returns the size and alignment unit in bytes of
// VMM allocations on device d with POSIX-fd export (2 MiB on H100/H200);
// recommended asks for the faster granularity instead of the minimum.
func MemGetAllocationGranularity(d Device, recommended bool) (int64, error) {
	prop := deviceProp(d)
	opt := uintptr(memAllocGranularityMinimum)
	if recommended {
		opt = memAllocGranularityRecommend
	}
	var n uint64
	if err := pMemGetGranularity.cu(uintptr(unsafe.Pointer(&n)), uintptr(unsafe.Pointer(&prop)), opt); err != nil {
		return 0, err
	}
	return int64(n), nil
}

// MemCreate allocates size bytes (a multiple of the granularity) of pinned
// device memory on d that can be exported as a POSIX file descriptor.
func MemCreate(size int64, d Device) (MemHandle, error) {
	if size <= 0 {
		return 0, badArg("MemCreate size %d", size)
	}
	prop := deviceProp(d)
	var h uint64
	if err := pMemCreate.cu(uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&prop)), 0); err != nil {
		return 0, err
	}
	return MemHandle(h), nil
}

// MemExportToFD exports h as a new file descriptor that another process can
// import after receiving it over a Unix socket (SCM_RIGHTS). The caller owns
// and closes the fd.
func MemExportToFD(h MemHandle) (int, error) {
	var fd int32 = -1
	if err := pMemExport.cu(uintptr(unsafe.Pointer(&fd)), uintptr(h), memHandleTypePosixFD, 0); err != nil {
		return -1, err
	}
	return int(fd), nil
}

// MemImportFromFD imports an allocation exported by MemExportToFD (possibly
// in another process). The fd stays open and owned by the caller. Release the
// handle with MemRelease after unmapping.
func MemImportFromFD(fd int) (MemHandle, error) {
	if fd < 0 {
		return 0, badArg("MemImportFromFD fd %d", fd)
	}
	var h uint64
	// For POSIX fds the "osHandle" argument is the fd value itself, cast to
	// void* (cuda.h, cuMemImportFromShareableHandle).
	if err := pMemImport.cu(uintptr(unsafe.Pointer(&h)), uintptr(fd), memHandleTypePosixFD); err != nil {
		return 0, err
	}
	return MemHandle(h), nil
}

// MemAddressReserve reserves size bytes of virtual address space aligned to
// align (0 = the default), both multiples of the granularity.
func MemAddressReserve(size, align int64) (DevicePtr, error) {
	if size <= 0 || align < 0 {
		return 0, badArg("MemAddressReserve size %d align %d", size, align)
	}
	var p uint64
	if err := pMemAddressReserve.cu(uintptr(unsafe.Pointer(&p)), uintptr(size), uintptr(align), 0, 0); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// MemAddressFree returns a range from MemAddressReserve.
func MemAddressFree(p DevicePtr, size int64) error {
	return pMemAddressFree.cu(uintptr(p), uintptr(size))
}

// MemMap maps the whole allocation h (size bytes) at p; then MemSetAccess.
func MemMap(p DevicePtr, size int64, h MemHandle) error {
	return pMemMap.cu(uintptr(p), uintptr(size), 0, uintptr(h), 0)
}

// MemSetAccess makes [p, p+size) readable and writable from device d.
func MemSetAccess(p DevicePtr, size int64, d Device) error {
	desc := memAccessDesc{Location: memLocation{Type: memLocationTypeDevice, ID: int32(d)}, Flags: memAccessProtReadWrite}
	return pMemSetAccess.cu(uintptr(p), uintptr(size), uintptr(unsafe.Pointer(&desc)), 1)
}

// MemUnmap unmaps [p, p+size).
func MemUnmap(p DevicePtr, size int64) error { return pMemUnmap.cu(uintptr(p), uintptr(size)) }

// MemRelease drops the handle; the memory goes when it is also unmapped
// everywhere.
func MemRelease(h MemHandle) error { return pMemRelease.cu(uintptr(h)) }

// IpcMemHandle is a CUipcMemHandle: 64 opaque bytes naming a MemAlloc
// allocation for another process (the legacy CUDA IPC that CuPy and PyTorch
// open).
type IpcMemHandle [64]byte

// IpcEventHandle is a CUipcEventHandle naming an interprocess event.
type IpcEventHandle [64]byte

// IpcGetMemHandle returns a handle to the allocation that starts at p
// (from MemAlloc).
func IpcGetMemHandle(p DevicePtr) (IpcMemHandle, error) {
	var h IpcMemHandle
	err := pIpcGetMemHandle.cu(uintptr(unsafe.Pointer(&h)), uintptr(p))
	return h, err
}

// words splits a 64-byte handle into the eight 8-byte stack slots in which
// the SysV amd64 ABI passes a 64-byte struct by value.
func words(h *[64]byte) (w [8]uintptr) {
	for i := range w {
		w[i] = uintptr(binary.LittleEndian.Uint64(h[8*i:]))
	}
	return w
}

// The IPC open calls take the 64-byte handle by value. On amd64 a struct of
// that size is passed in memory: it occupies the stack slots after the six
// integer registers, while the other integer arguments still use the
// registers (so the flags go in the second register). purego puts arguments
// 7 and later on the stack in order, so the calls below fill registers 3..6
// with zeros and then the eight words. On arm64 (AAPCS64) a struct larger than
// 16 bytes is copied by the caller and passed by address.

// IpcOpenMemHandle maps an allocation of another process into this one's
// current context, with peer access enabled lazily
// (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS). It fails within the exporting
// process itself. Close with IpcCloseMemHandle.
func IpcOpenMemHandle(h IpcMemHandle) (DevicePtr, error) {
	var p uint64
	var err error
	switch runtime.GOARCH {
	case "amd64":
		w := words((*[64]byte)(&h))
		err = pIpcOpenMemHandle.cu(uintptr(unsafe.Pointer(&p)), ipcMemLazyEnablePeerAccess, 0, 0, 0, 0,
			w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])
	case "arm64":
		c := h
		err = pIpcOpenMemHandle.cu(uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&c)), ipcMemLazyEnablePeerAccess)
	default:
		return 0, badArg("IpcOpenMemHandle is not supported on %s", runtime.GOARCH)
	}
	if err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

// IpcCloseMemHandle unmaps memory opened with IpcOpenMemHandle.
func IpcCloseMemHandle(p DevicePtr) error { return pIpcCloseMemHandle.cu(uintptr(p)) }

// IpcGetEventHandle returns a handle to an event created with
// EventInterprocess|EventDisableTiming.
func IpcGetEventHandle(e Event) (IpcEventHandle, error) {
	var h IpcEventHandle
	err := pIpcGetEventHandle.cu(uintptr(unsafe.Pointer(&h)), uintptr(e))
	return h, err
}

// IpcOpenEventHandle opens an event of another process. Streams of this
// process can then wait on it (Stream.WaitEvent) to order their work after
// the other process's. Destroy it when done.
func IpcOpenEventHandle(h IpcEventHandle) (Event, error) {
	var e uintptr
	var err error
	switch runtime.GOARCH {
	case "amd64":
		w := words((*[64]byte)(&h))
		err = pIpcOpenEvtHandle.cu(uintptr(unsafe.Pointer(&e)), 0, 0, 0, 0, 0,
			w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])
	case "arm64":
		c := h
		err = pIpcOpenEvtHandle.cu(uintptr(unsafe.Pointer(&e)), uintptr(unsafe.Pointer(&c)))
	default:
		return 0, badArg("IpcOpenEventHandle is not supported on %s", runtime.GOARCH)
	}
	if err != nil {
		return 0, err
	}
	return Event(e), nil
}
