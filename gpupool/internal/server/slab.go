package server

import (
	"fmt"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/device"
)

// Slab is one block of shareable memory the pool sub-allocates.
type Slab interface {
	// FD is the handle sent to clients (SCM_RIGHTS); owned by the slab.
	FD() int
	// Size is the slab's length in bytes.
	Size() int64
	// Kind says how a client maps FD (device.ShareMemfd, device.ShareVMM).
	Kind() device.ShareKind
	// Close releases the slab. Clients that mapped it keep their mapping
	// until they unmap it; the memory returns to the system after that.
	Close() error
}

// SlabSource makes slabs: Memfd on the host, CUDA (cuda.go: cuMemCreate
// with the POSIX fd handle type, exported with
// cuMemExportToShareableHandle) on a GPU; the protocol is the same for both.
type SlabSource interface {
	// NewSlab returns a slab of at least size bytes (a multiple of Granularity).
	NewSlab(size int64) (Slab, error)
	// Granularity is the unit of slab sizes in bytes (page size; 2 MiB for VMM on H200).
	Granularity() int64
	// Backend names the memory for hello: "host" or "cuda".
	Backend() string
}

// Memfd is the host SlabSource: memfd_create slabs, sized with ftruncate
// and then sealed (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL) before any fd
// of theirs leaves the daemon, so that no client can truncate a slab under
// the others (they would die of SIGBUS, and sealed buffers would lose their
// bytes) or grow it into memory no limit sees. Pages are allocated by the
// kernel when first touched and read as zero.
type Memfd struct{}

// memfdSeals are the seals of every memfd slab.
const memfdSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

type memfdSlab struct {
	fd   int
	size int64
}

// NewSlab implements SlabSource.
func (Memfd) NewSlab(size int64) (Slab, error) {
	size = device.RoundUp(size, Memfd{}.Granularity())
	fd, err := unix.MemfdCreate("gpupool-slab", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("gpupool: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("gpupool: size memfd slab to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, memfdSeals); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("gpupool: seal memfd slab: %w", err)
	}
	return &memfdSlab{fd: fd, size: size}, nil
}

// Granularity implements SlabSource: the page size.
func (Memfd) Granularity() int64 { return int64(unix.Getpagesize()) }

// Backend implements SlabSource.
func (Memfd) Backend() string { return "host" }

func (s *memfdSlab) FD() int                { return s.fd }
func (s *memfdSlab) Size() int64            { return s.size }
func (s *memfdSlab) Kind() device.ShareKind { return device.ShareMemfd }
func (s *memfdSlab) Close() error           { return unix.Close(s.fd) }

// LegacySource is a SlabSource that can also make legacy-IPC buffers:
// cuMemAlloc memory with a 64-byte CUipcMemHandle, which CuPy and PyTorch
// open (cudaIpcOpenMemHandle). The returned Slab has Kind
// device.ShareLegacyIPC, FD -1, and an IPCHandle() [64]byte method.
type LegacySource interface {
	SlabSource
	NewLegacy(size int64) (Slab, error)
}
