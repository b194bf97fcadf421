package server

import (
	"fmt"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
)

// CUDA is the GPU SlabSource: slabs are VMM allocations (cuMemCreate with
// the POSIX file-descriptor handle type, sized in multiples of the
// recommended granularity) exported as fds; legacy buffers are cuMemAlloc
// allocations with a CUipcMemHandle. The daemon keeps each slab mapped in
// its own address space too, so the memory lives while the daemon holds it.
type CUDA struct {
	Dev  *device.CUDA
	gran int64
}

// NewCUDA returns the source for dev, reading its recommended VMM
// granularity (cuMemGetAllocationGranularity, 2 MiB on H100/H200).
func NewCUDA(dev *device.CUDA) (*CUDA, error) {
	var g int64
	err := dev.Do(func() error {
		var err error
		g, err = cuda.MemGetAllocationGranularity(dev.DriverDevice(), true)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("gpupool: %v: VMM granularity: %w", dev, err)
	}
	if min, err := dev.VMMGranularity(); err == nil && g%min != 0 {
		g = device.RoundUp(g, min)
	}
	return &CUDA{Dev: dev, gran: g}, nil
}

// Granularity implements SlabSource.
func (c *CUDA) Granularity() int64 { return c.gran }

// Backend implements SlabSource.
func (c *CUDA) Backend() string { return "cuda" }

// Ordinal is the device ordinal clients should map slabs on.
func (c *CUDA) Ordinal() int { return c.Dev.Ordinal() }

// MemInfo returns the device's free and total memory in bytes (cuMemGetInfo).
func (c *CUDA) MemInfo() (free, total int64, err error) {
	err = c.Dev.Do(func() error {
		var err error
		free, total, err = cuda.MemGetInfo()
		return err
	})
	return free, total, err
}

type cudaSlab struct {
	b      *device.Buffer
	size   int64
	kind   device.ShareKind
	fd     int
	handle [64]byte
}

// NewSlab implements SlabSource.
func (c *CUDA) NewSlab(size int64) (Slab, error) {
	size = device.RoundUp(size, c.gran)
	b, err := c.Dev.AllocVMM(size)
	if err != nil {
		return nil, fmt.Errorf("gpupool: %w", err)
	}
	sh := b.Share()
	return &cudaSlab{b: b, size: sh.SlabSize, kind: device.ShareVMM, fd: sh.FD}, nil
}

// NewLegacy implements LegacySource.
func (c *CUDA) NewLegacy(size int64) (Slab, error) {
	b, err := c.Dev.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("gpupool: %w", err)
	}
	sh := b.Share()
	if sh.Kind != device.ShareLegacyIPC {
		b.Free()
		return nil, fmt.Errorf("gpupool: the driver gave no IPC handle for a cuMemAlloc buffer of %d bytes", size)
	}
	return &cudaSlab{b: b, size: size, kind: device.ShareLegacyIPC, fd: -1, handle: sh.Legacy}, nil
}

func (s *cudaSlab) FD() int                { return s.fd }
func (s *cudaSlab) Size() int64            { return s.size }
func (s *cudaSlab) Kind() device.ShareKind { return s.kind }
func (s *cudaSlab) IPCHandle() [64]byte    { return s.handle }
func (s *cudaSlab) Close() error           { return s.b.Free() }

var _ LegacySource = (*CUDA)(nil)
