package device

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Host is the CPU backend. Every allocation is its own memfd slab, mapped
// shared, so its Shareable fd can be sent to another process.
type Host struct{}

// NewHost returns the host device.
func NewHost() *Host { return &Host{} }

// Kind implements Device.
func (*Host) Kind() Kind { return KindHost }

func (*Host) String() string { return "host" }

// Alloc implements Device: a memfd of size bytes rounded up to the page size.
func (h *Host) Alloc(size int64) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: %d", ErrBadSize, size)
	}
	fd, err := unix.MemfdCreate("gpukit", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("device: memfd_create: %w", err)
	}
	slab := RoundUp(size, int64(unix.Getpagesize()))
	if err := unix.Ftruncate(fd, slab); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("device: ftruncate memfd to %d bytes: %w", slab, err)
	}
	mem, err := MapFD(fd, slab)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	share := Shareable{Kind: ShareMemfd, FD: fd, SlabSize: slab, Offset: 0, Size: size}
	return NewBuffer(h, uintptr(unsafe.Pointer(&mem[0])), size, mem[:size:size], share, func() error { // mmap'd, not Go memory
		err1 := unix.Munmap(mem)
		err2 := unix.Close(fd)
		if err1 != nil {
			return err1
		}
		return err2
	}), nil
}

// MapFD maps size bytes of a memfd (or any shared-memory fd) read-write and shared.
func MapFD(fd int, size int64) ([]byte, error) {
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("device: mmap %d bytes: %w", size, err)
	}
	return mem, nil
}

// CopyIn implements Device.
func (h *Host) CopyIn(b *Buffer, off int64, src []byte) error {
	if err := checkHost(h, b, off, int64(len(src))); err != nil {
		return err
	}
	copy(b.host[off:], src)
	return nil
}

// CopyOut implements Device.
func (h *Host) CopyOut(dst []byte, b *Buffer, off int64) error {
	if err := checkHost(h, b, off, int64(len(dst))); err != nil {
		return err
	}
	copy(dst, b.host[off:])
	return nil
}

func checkHost(h *Host, b *Buffer, off, n int64) error {
	if b.dev.Kind() != KindHost || b.host == nil {
		return fmt.Errorf("%w: %s buffer on %s", ErrWrongKind, b.dev, h)
	}
	if b.freed.Load() {
		return ErrFreed
	}
	return b.CheckRange(off, n)
}

// Sync implements Device; host work is synchronous.
func (*Host) Sync() error { return nil }

// Close implements Device.
func (*Host) Close() error { return nil }

// RoundUp rounds n up to a multiple of align (align > 0).
func RoundUp(n, align int64) int64 { return (n + align - 1) / align * align }
