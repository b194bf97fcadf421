package device

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Kind names a backend.
type Kind uint8

const (
	// KindHost is the CPU backend: memfd slabs in host memory.
	KindHost Kind = iota
	// KindCUDA is an NVIDIA GPU driven through the CUDA driver API.
	KindCUDA
)

func (k Kind) String() string {
	switch k {
	case KindHost:
		return "host"
	case KindCUDA:
		return "cuda"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Errors returned by devices and buffers.
var (
	ErrFreed     = errors.New("device: buffer already freed")
	ErrRange     = errors.New("device: range out of bounds")
	ErrWrongKind = errors.New("device: buffer belongs to another device")
	ErrBadSize   = errors.New("device: size must be positive")
)

// Device is one place where buffers live and work runs.
type Device interface {
	// Kind says which backend this is.
	Kind() Kind
	// String names the device for logs: "host", "cuda:0 NVIDIA H200".
	String() string
	// Alloc returns a new buffer of size bytes (size > 0), contents undefined.
	Alloc(size int64) (*Buffer, error)
	// CopyIn copies len(src) bytes from host memory into b at byte offset off.
	CopyIn(b *Buffer, off int64, src []byte) error
	// CopyOut copies len(dst) bytes from b at byte offset off into host memory.
	CopyOut(dst []byte, b *Buffer, off int64) error
	// Sync waits until all work queued on the device has finished.
	Sync() error
	// Close releases the device's own resources (not buffers still held).
	Close() error
}

// Allocator hands out buffers. name may be empty; allocators that keep
// names (the pool) make a named buffer openable by other processes.
type Allocator interface {
	Alloc(name string, size int64) (*Buffer, error)
	Device() Device
}

// Local adapts a Device to Allocator: names are ignored, memory stays in
// this process.
type Local struct{ Dev Device }

// Alloc implements Allocator.
func (l Local) Alloc(_ string, size int64) (*Buffer, error) { return l.Dev.Alloc(size) }

// Device implements Allocator.
func (l Local) Device() Device { return l.Dev }

// ShareKind says how a buffer can be mapped by another process.
type ShareKind uint8

const (
	// ShareNone: the buffer cannot leave its process.
	ShareNone ShareKind = iota
	// ShareMemfd: a memfd slab; map FD with mmap and read at Offset.
	ShareMemfd
	// ShareVMM: a CUDA VMM allocation exported as a POSIX fd
	// (cuMemExportToShareableHandle with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).
	ShareVMM
	// ShareLegacyIPC: a cuMemAlloc buffer with a 64-byte CUipcMemHandle.
	ShareLegacyIPC
)

func (k ShareKind) String() string {
	switch k {
	case ShareNone:
		return "none"
	case ShareMemfd:
		return "memfd"
	case ShareVMM:
		return "vmm"
	case ShareLegacyIPC:
		return "legacy-ipc"
	}
	return fmt.Sprintf("share(%d)", uint8(k))
}

// Shareable is the form of a buffer another process can map: a slab fd (or
// legacy IPC handle) plus the byte range of the buffer inside it.
type Shareable struct {
	Kind     ShareKind
	FD       int   // memfd or VMM fd owned by the slab; -1 when none
	SlabSize int64 // bytes in the whole slab
	Offset   int64 // byte offset of the buffer in the slab
	Size     int64 // bytes in the buffer
	Legacy   [64]byte
}

// Buffer is a byte range on a device. Ptr is a host virtual address for host
// buffers and a CUdeviceptr for CUDA buffers. Buffers are not safe for
// concurrent Free.
type Buffer struct {
	dev   Device
	ptr   uintptr
	size  int64
	host  []byte
	share Shareable
	free  func() error
	freed atomic.Bool
}

// NewBuffer wraps memory a backend (or the pool client) owns. host is the
// host-visible mapping (nil for device memory); free is called once by Free
// (nil for views).
func NewBuffer(dev Device, ptr uintptr, size int64, host []byte, share Shareable, free func() error) *Buffer {
	return &Buffer{dev: dev, ptr: ptr, size: size, host: host, share: share, free: free}
}

// Device is where the buffer lives.
func (b *Buffer) Device() Device { return b.dev }

// Ptr is the address of the first byte (host address or CUdeviceptr).
func (b *Buffer) Ptr() uintptr { return b.ptr }

// Size is the length in bytes.
func (b *Buffer) Size() int64 { return b.size }

// Bytes is the host-visible memory, or nil for device memory.
func (b *Buffer) Bytes() []byte { return b.host }

// Share is how another process can map this buffer.
func (b *Buffer) Share() Shareable { return b.share }

// View returns the sub-range [off, off+size) sharing memory with b. Freeing
// a view does nothing; it is valid while b is.
func (b *Buffer) View(off, size int64) (*Buffer, error) {
	if off < 0 || size < 0 || off+size > b.size {
		return nil, fmt.Errorf("%w: view [%d,+%d) of %d bytes", ErrRange, off, size, b.size)
	}
	v := &Buffer{dev: b.dev, ptr: b.ptr + uintptr(off), size: size, share: b.share}
	if b.host != nil {
		v.host = b.host[off : off+size : off+size]
	}
	v.share.Offset += off
	v.share.Size = size
	return v, nil
}

// Free releases the buffer. A second Free returns ErrFreed.
func (b *Buffer) Free() error {
	if b.freed.Swap(true) {
		return ErrFreed
	}
	if b.free == nil {
		return nil
	}
	return b.free()
}

// CheckRange reports whether [off, off+n) lies inside b.
func (b *Buffer) CheckRange(off, n int64) error {
	if off < 0 || n < 0 || off+n > b.size {
		return fmt.Errorf("%w: [%d,+%d) of %d bytes", ErrRange, off, n, b.size)
	}
	return nil
}
