package device

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/cuda"
)

// ErrClosed is returned by a CUDA device's methods after Close.
var ErrClosed = errors.New("device: device closed")

// CUDADevice is a CUDA device as seen by code that queues work on it (ops,
// the trainer): Do runs f on an OS thread where the device's context is
// current. *CUDA implements it.
type CUDADevice interface {
	Device
	// Do pins the calling goroutine to its OS thread, makes the device's
	// context current there and runs f; f must not keep the thread.
	Do(f func() error) error
	// Context is the retained primary context (for kernels.ForContext).
	Context() *cuda.Context
	// Ordinal is the CUDA device ordinal.
	Ordinal() int
	// ComputeCapability is the SM version, e.g. 9, 0.
	ComputeCapability() (major, minor int)
}

// CUDA is one NVIDIA GPU driven through the CUDA driver API
// (libgpu/cuda, loaded at run time) in its primary context, the context the
// CUDA runtime, PyTorch and CuPy also use. Every method pins its goroutine
// and makes the context current (Do), so callers need not. Safe for
// concurrent use; Close must not race with other calls.
type CUDA struct {
	ordinal      int
	dev          cuda.Device
	ctx          *cuda.Context
	name         string
	major, minor int
	totalMem     int64
	stream       cuda.Stream

	mu     sync.Mutex
	closed bool
}

var _ CUDADevice = (*CUDA)(nil)

// NewCUDA opens GPU ordinal (0-based): it loads the driver, retains the
// device's primary context and creates the device's own non-blocking stream.
// Without a driver the error wraps cuda.ErrNoLibrary; without such a device
// it wraps cuda.ErrorNoDevice or cuda.ErrorInvalidDevice.
func NewCUDA(ordinal int) (*CUDA, error) {
	if ordinal < 0 {
		return nil, fmt.Errorf("device: cuda:%d: %w", ordinal, cuda.ErrorInvalidDevice)
	}
	if err := cuda.Init(); err != nil {
		return nil, fmt.Errorf("device: cuda:%d: %w", ordinal, err)
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("device: cuda:%d: %w", ordinal, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("device: cuda:%d: %w", ordinal, cuda.ErrorNoDevice)
	}
	if ordinal >= n {
		return nil, fmt.Errorf("device: cuda:%d: only %d device(s): %w", ordinal, n, cuda.ErrorInvalidDevice)
	}
	cd, err := cuda.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("device: cuda:%d: %w", ordinal, err)
	}
	d := &CUDA{ordinal: ordinal, dev: cd}
	if d.name, err = cd.Name(); err != nil {
		return nil, fmt.Errorf("device: cuda:%d name: %w", ordinal, err)
	}
	if d.major, d.minor, err = cd.ComputeCapability(); err != nil {
		return nil, fmt.Errorf("device: cuda:%d compute capability: %w", ordinal, err)
	}
	if d.totalMem, err = cd.TotalMem(); err != nil {
		return nil, fmt.Errorf("device: cuda:%d memory: %w", ordinal, err)
	}
	if d.ctx, err = cuda.PrimaryContext(cd); err != nil {
		return nil, fmt.Errorf("device: cuda:%d primary context: %w", ordinal, err)
	}
	err = d.do(func() error {
		s, err := cuda.StreamCreate(true)
		d.stream = s
		return err
	})
	if err != nil {
		d.ctx.Release()
		return nil, fmt.Errorf("device: cuda:%d stream: %w", ordinal, err)
	}
	return d, nil
}

// CUDACount is the number of GPUs this process sees (CUDA_VISIBLE_DEVICES
// applied): 0, with the reason, when there is no driver or no device.
func CUDACount() (int, error) {
	if err := cuda.Init(); err != nil {
		return 0, err
	}
	return cuda.DeviceCount()
}

// Auto returns GPU ordinal when one answers, else the host device. Only the
// absence of a GPU (no driver library, no device, no such ordinal) selects
// the host; any other failure of a present GPU is returned as an error.
func Auto(ordinal int) (Device, error) {
	d, err := NewCUDA(ordinal)
	if err == nil {
		return d, nil
	}
	if NoGPU(err) {
		return NewHost(), nil
	}
	return nil, err
}

// NoGPU reports whether err (from NewCUDA) means there is no usable GPU here
// rather than a failing one: no driver library, a driver without the needed
// symbols, no device, or no device with that ordinal.
func NoGPU(err error) bool {
	return errors.Is(err, cuda.ErrNoLibrary) || errors.Is(err, cuda.ErrNoSymbol) ||
		errors.Is(err, cuda.ErrorNoDevice) || errors.Is(err, cuda.ErrorInvalidDevice)
}

// Kind implements Device.
func (*CUDA) Kind() Kind { return KindCUDA }

// String names the device: "cuda:0 NVIDIA H200 (sm_90)".
func (d *CUDA) String() string {
	return fmt.Sprintf("cuda:%d %s (sm_%d%d)", d.ordinal, d.name, d.major, d.minor)
}

// Ordinal is the CUDA device ordinal.
func (d *CUDA) Ordinal() int { return d.ordinal }

// Name is the device's marketing name ("NVIDIA H200").
func (d *CUDA) Name() string { return d.name }

// ComputeCapability is the SM version, e.g. 9, 0 for an H100 or H200.
func (d *CUDA) ComputeCapability() (major, minor int) { return d.major, d.minor }

// TotalMem is the device's memory in bytes.
func (d *CUDA) TotalMem() int64 { return d.totalMem }

// DriverDevice is the driver's device handle (CUdevice).
func (d *CUDA) DriverDevice() cuda.Device { return d.dev }

// Context is the retained primary context.
func (d *CUDA) Context() *cuda.Context { return d.ctx }

// Stream is the device's own non-blocking stream, for tools that queue
// work outside ops (ops engines own their streams). It is destroyed by Close.
func (d *CUDA) Stream() cuda.Stream { return d.stream }

// Do pins the calling goroutine to its OS thread (runtime.LockOSThread,
// undone on return), makes the device's primary context current on it and
// runs f. Calls may nest. After Close it returns ErrClosed without running f.
func (d *CUDA) Do(f func() error) error {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return fmt.Errorf("%w: %v", ErrClosed, d)
	}
	return d.do(f)
}

func (d *CUDA) do(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.ctx.SetCurrent(); err != nil {
		return fmt.Errorf("device: %v: %w", d, err)
	}
	return f()
}

// Alloc implements Device with cuMemAlloc (256-byte aligned, contents
// undefined). The buffer carries a legacy CUDA IPC handle (ShareLegacyIPC)
// that another process (CuPy, PyTorch, or gpukit's OpenIPC) can open; when
// the driver cannot make one, the buffer is ShareNone.
func (d *CUDA) Alloc(size int64) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: %d", ErrBadSize, size)
	}
	var p cuda.DevicePtr
	share := Shareable{Kind: ShareNone, FD: -1, SlabSize: size, Size: size}
	err := d.Do(func() error {
		var err error
		if p, err = cuda.MemAlloc(size); err != nil {
			return err
		}
		if h, err := cuda.IpcGetMemHandle(p); err == nil {
			share.Kind = ShareLegacyIPC
			share.Legacy = h
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("device: %v: alloc %d bytes: %w", d, size, err)
	}
	return NewBuffer(d, uintptr(p), size, nil, share, func() error {
		return d.do(func() error { return cuda.MemFree(p) })
	}), nil
}

// VMMGranularity is the size unit of AllocVMM slabs on this device (2 MiB
// on H100/H200).
func (d *CUDA) VMMGranularity() (int64, error) {
	g, err := cuda.MemGetAllocationGranularity(d.dev, false)
	if err != nil {
		return 0, fmt.Errorf("device: %v: VMM granularity: %w", d, err)
	}
	return g, nil
}

// AllocVMM allocates size bytes (rounded up to VMMGranularity) with the VMM
// API (cuMemCreate with the POSIX file-descriptor handle type), maps them
// read-write for this device and exports them as an fd. The buffer's
// Shareable is ShareVMM with that fd, SlabSize the rounded size, Offset 0 and
// Size size: another process maps it with ImportVMM after receiving the fd
// (SCM_RIGHTS). The fd is owned by the buffer and closed by Free.
func (d *CUDA) AllocVMM(size int64) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: %d", ErrBadSize, size)
	}
	gran, err := d.VMMGranularity()
	if err != nil {
		return nil, err
	}
	slab := RoundUp(size, gran)
	var (
		h  cuda.MemHandle
		p  cuda.DevicePtr
		fd = -1
	)
	err = d.Do(func() error {
		var err error
		if h, err = cuda.MemCreate(slab, d.dev); err != nil {
			return err
		}
		if fd, err = cuda.MemExportToFD(h); err != nil {
			cuda.MemRelease(h)
			return err
		}
		if p, err = mapVMM(h, slab, gran, d.dev); err != nil {
			unix.Close(fd)
			cuda.MemRelease(h)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("device: %v: VMM alloc %d bytes: %w", d, slab, err)
	}
	share := Shareable{Kind: ShareVMM, FD: fd, SlabSize: slab, Offset: 0, Size: size}
	return NewBuffer(d, uintptr(p), size, nil, share, func() error {
		err := d.do(func() error { return unmapVMM(p, slab, h) })
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
		return err
	}), nil
}

// mapVMM reserves an address range for the allocation h, maps it and makes
// it read-write for dev. On failure nothing stays reserved or mapped.
func mapVMM(h cuda.MemHandle, slab, gran int64, dev cuda.Device) (cuda.DevicePtr, error) {
	p, err := cuda.MemAddressReserve(slab, gran)
	if err != nil {
		return 0, err
	}
	if err := cuda.MemMap(p, slab, h); err != nil {
		cuda.MemAddressFree(p, slab)
		return 0, err
	}
	if err := cuda.MemSetAccess(p, slab, dev); err != nil {
		cuda.MemUnmap(p, slab)
		cuda.MemAddressFree(p, slab)
		return 0, err
	}
	return p, nil
}

func unmapVMM(p cuda.DevicePtr, slab int64, h cuda.MemHandle) error {
	err := cuda.MemUnmap(p, slab)
	if e := cuda.MemRelease(h); err == nil {
		err = e
	}
	if e := cuda.MemAddressFree(p, slab); err == nil {
		err = e
	}
	return err
}

// ImportVMM maps a slab another process exported with AllocVMM (sh.Kind ==
// ShareVMM, sh.FD received over a Unix socket) and returns the buffer
// [sh.Offset, sh.Offset+sh.Size) of it on this device. The fd stays owned by
// the caller; Free unmaps the slab.
func (d *CUDA) ImportVMM(sh Shareable) (*Buffer, error) {
	if sh.Kind != ShareVMM || sh.FD < 0 {
		return nil, fmt.Errorf("%w: import of a %v shareable (want vmm with an fd)", ErrWrongKind, sh.Kind)
	}
	if sh.SlabSize <= 0 || sh.Offset < 0 || sh.Size <= 0 || sh.Offset+sh.Size > sh.SlabSize {
		return nil, fmt.Errorf("%w: [%d,+%d) of a %d-byte slab", ErrRange, sh.Offset, sh.Size, sh.SlabSize)
	}
	gran, err := d.VMMGranularity()
	if err != nil {
		return nil, err
	}
	if sh.SlabSize%gran != 0 {
		return nil, fmt.Errorf("%w: slab of %d bytes is not a multiple of the granularity %d", ErrRange, sh.SlabSize, gran)
	}
	var (
		h cuda.MemHandle
		p cuda.DevicePtr
	)
	err = d.Do(func() error {
		var err error
		if h, err = cuda.MemImportFromFD(sh.FD); err != nil {
			return err
		}
		if p, err = mapVMM(h, sh.SlabSize, gran, d.dev); err != nil {
			cuda.MemRelease(h)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("device: %v: VMM import of %d bytes: %w", d, sh.SlabSize, err)
	}
	out := sh
	out.FD = -1 // not ours
	slab := sh.SlabSize
	return NewBuffer(d, uintptr(p)+uintptr(sh.Offset), sh.Size, nil, out, func() error {
		return d.do(func() error { return unmapVMM(p, slab, h) })
	}), nil
}

// OpenIPC opens a buffer another process allocated with Alloc from its
// legacy IPC handle (sh.Kind == ShareLegacyIPC) and returns
// [sh.Offset, sh.Offset+sh.Size) of it. It fails inside the exporting
// process itself (a CUDA rule). Free closes the mapping.
func (d *CUDA) OpenIPC(sh Shareable) (*Buffer, error) {
	if sh.Kind != ShareLegacyIPC {
		return nil, fmt.Errorf("%w: open of a %v shareable (want legacy-ipc)", ErrWrongKind, sh.Kind)
	}
	if sh.Offset < 0 || sh.Size <= 0 || sh.Offset+sh.Size > sh.SlabSize {
		return nil, fmt.Errorf("%w: [%d,+%d) of a %d-byte allocation", ErrRange, sh.Offset, sh.Size, sh.SlabSize)
	}
	var p cuda.DevicePtr
	err := d.Do(func() error {
		var err error
		p, err = cuda.IpcOpenMemHandle(cuda.IpcMemHandle(sh.Legacy))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("device: %v: open IPC handle: %w", d, err)
	}
	out := sh
	out.FD = -1
	return NewBuffer(d, uintptr(p)+uintptr(sh.Offset), sh.Size, nil, out, func() error {
		return d.do(func() error { return cuda.IpcCloseMemHandle(p) })
	}), nil
}

// check verifies that b is a live buffer of d and [off, off+n) lies in it.
func (d *CUDA) check(b *Buffer, off, n int64) error {
	if b == nil {
		return fmt.Errorf("%w: nil buffer", ErrRange)
	}
	if b.dev != Device(d) {
		return fmt.Errorf("%w: %v buffer on %v", ErrWrongKind, b.dev, d)
	}
	if b.freed.Load() {
		return ErrFreed
	}
	return b.CheckRange(off, n)
}

// CopyIn implements Device. It is synchronous and ordered after all work
// queued on the device, on every stream: it waits for the context
// (cuCtxSynchronize), copies (cuMemcpyHtoD) and waits again, so neither a
// kernel still reading b nor one queued later on a non-blocking stream can
// race with the copy. Not allowed while a stream of the device is capturing.
func (d *CUDA) CopyIn(b *Buffer, off int64, src []byte) error {
	if err := d.check(b, off, int64(len(src))); err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	err := d.Do(func() error {
		if err := cuda.CtxSynchronize(); err != nil {
			return err
		}
		if err := cuda.MemcpyHtoD(cuda.DevicePtr(b.ptr).Add(off), unsafe.Pointer(&src[0]), int64(len(src))); err != nil {
			return err
		}
		// From pageable memory the call may return before the DMA has
		// finished (CUDA driver API, "API synchronization behavior").
		return cuda.CtxSynchronize()
	})
	if err != nil {
		return fmt.Errorf("device: %v: copy %d bytes in: %w", d, len(src), err)
	}
	return nil
}

// CopyOut implements Device. It waits for all work queued on the device
// (cuCtxSynchronize) and then copies (cuMemcpyDtoH, which returns when the
// data is in dst), so it sees the results of every stream's kernels.
func (d *CUDA) CopyOut(dst []byte, b *Buffer, off int64) error {
	if err := d.check(b, off, int64(len(dst))); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	err := d.Do(func() error {
		if err := cuda.CtxSynchronize(); err != nil {
			return err
		}
		return cuda.MemcpyDtoH(unsafe.Pointer(&dst[0]), cuda.DevicePtr(b.ptr).Add(off), int64(len(dst)))
	})
	if err != nil {
		return fmt.Errorf("device: %v: copy %d bytes out: %w", d, len(dst), err)
	}
	return nil
}

// Sync implements Device: it waits for all work queued in the context, on
// every stream (cuCtxSynchronize). A failed kernel shows up here.
func (d *CUDA) Sync() error {
	if err := d.Do(cuda.CtxSynchronize); err != nil {
		return fmt.Errorf("device: %v: sync: %w", d, err)
	}
	return nil
}

// Close waits for queued work, destroys the device's stream and releases
// its reference to the primary context. Buffers stay valid while another
// reference to the primary context exists (another CUDA device value, an
// ops engine, the CUDA runtime of a library in the same process); free them
// before closing the last one. A second Close does nothing.
func (d *CUDA) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	err := d.do(func() error {
		err := cuda.CtxSynchronize()
		if e := d.stream.Destroy(); err == nil {
			err = e
		}
		return err
	})
	if e := d.ctx.Release(); err == nil {
		err = e
	}
	if err != nil {
		return fmt.Errorf("device: %v: close: %w", d, err)
	}
	return nil
}
