package cuda

import (
	"sync"
	"unsafe"
)

var (
	pInit              = newProc(libDriver, "cuInit")
	pDriverGetVersion  = newProc(libDriver, "cuDriverGetVersion")
	pDeviceGetCount    = newProc(libDriver, "cuDeviceGetCount")
	pDeviceGet         = newProc(libDriver, "cuDeviceGet")
	pDeviceGetName     = newProc(libDriver, "cuDeviceGetName")
	pDeviceGetAttr     = newProc(libDriver, "cuDeviceGetAttribute")
	pDeviceTotalMem    = newProc(libDriver, "cuDeviceTotalMem_v2")
	pPrimaryCtxRetain  = newProc(libDriver, "cuDevicePrimaryCtxRetain")
	pPrimaryCtxRelease = newProc(libDriver, "cuDevicePrimaryCtxRelease_v2")
	pCtxSetCurrent     = newProc(libDriver, "cuCtxSetCurrent")
	pCtxSynchronize    = newProc(libDriver, "cuCtxSynchronize")
)

var (
	initOnce sync.Once
	initErr  error
)

// Init loads the driver and calls cuInit(0), once per process; later calls
// return the first call's error. Functions that need it (DeviceCount,
// GetDevice, Available) call it themselves.
func Init() error {
	initOnce.Do(func() { initErr = pInit.cu(0) })
	return initErr
}

// Available reports whether the driver loads, cuInit succeeds and at least
// one device is visible.
func Available() bool {
	n, err := DeviceCount()
	return err == nil && n > 0
}

// DriverVersion returns the driver's CUDA version as 1000*major + 10*minor
// (13000 for CUDA 13.0).
func DriverVersion() (int, error) {
	var v int32
	if err := pDriverGetVersion.cu(uintptr(unsafe.Pointer(&v))); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DeviceCount returns the number of visible CUDA devices.
func DeviceCount() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var n int32
	if err := pDeviceGetCount.cu(uintptr(unsafe.Pointer(&n))); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Device is a CUdevice: an ordinal handle from GetDevice.
type Device int32

// GetDevice returns the device with the given ordinal (0-based).
func GetDevice(ordinal int) (Device, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var d int32
	if err := pDeviceGet.cu(uintptr(unsafe.Pointer(&d)), uintptr(ordinal)); err != nil {
		return 0, err
	}
	return Device(d), nil
}

// Name returns the device's marketing name, e.g. "NVIDIA H200".
func (d Device) Name() (string, error) {
	var buf [256]byte
	if err := pDeviceGetName.cu(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d)); err != nil {
		return "", err
	}
	for i, c := range buf {
		if c == 0 {
			return string(buf[:i]), nil
		}
	}
	return string(buf[:]), nil
}

// DeviceAttribute is a CUdevice_attribute (values from cuda.h).
type DeviceAttribute int32

// Device attributes.
const (
	AttrMaxThreadsPerBlock                     DeviceAttribute = 1
	AttrWarpSize                               DeviceAttribute = 10
	AttrClockRate                              DeviceAttribute = 13 // kHz
	AttrMultiprocessorCount                    DeviceAttribute = 16
	AttrMemoryClockRate                        DeviceAttribute = 36 // kHz
	AttrGlobalMemoryBusWidth                   DeviceAttribute = 37 // bits
	AttrL2CacheSize                            DeviceAttribute = 38 // bytes
	AttrMaxThreadsPerMultiprocessor            DeviceAttribute = 39
	AttrUnifiedAddressing                      DeviceAttribute = 41
	AttrComputeCapabilityMajor                 DeviceAttribute = 75
	AttrComputeCapabilityMinor                 DeviceAttribute = 76
	AttrMaxSharedMemoryPerMultiprocessor       DeviceAttribute = 81 // bytes
	AttrMaxSharedMemoryPerBlockOptin           DeviceAttribute = 97 // bytes
	AttrVirtualMemoryManagementSupported       DeviceAttribute = 102
	AttrHandleTypePosixFileDescriptorSupported DeviceAttribute = 103
)

// Attribute returns one integer property of the device.
func (d Device) Attribute(a DeviceAttribute) (int, error) {
	var v int32
	if err := pDeviceGetAttr.cu(uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(d)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// ComputeCapability returns the SM version, e.g. 9, 0 for an H100/H200.
func (d Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	if minor, err = d.Attribute(AttrComputeCapabilityMinor); err != nil {
		return 0, 0, err
	}
	return major, minor, nil
}

// TotalMem returns the device's memory in bytes.
func (d Device) TotalMem() (int64, error) {
	var n uint64
	if err := pDeviceTotalMem.cu(uintptr(unsafe.Pointer(&n)), uintptr(d)); err != nil {
		return 0, err
	}
	return int64(n), nil
}

// Context is a retained primary context (CUcontext) of one device.
type Context struct {
	h   uintptr
	dev Device
}

// PrimaryContext retains the device's primary context (the one the CUDA
// runtime, PyTorch and CuPy also use). Release it when done.
func PrimaryContext(d Device) (*Context, error) {
	var h uintptr
	if err := pPrimaryCtxRetain.cu(uintptr(unsafe.Pointer(&h)), uintptr(d)); err != nil {
		return nil, err
	}
	return &Context{h: h, dev: d}, nil
}

// Device returns the context's device.
func (c *Context) Device() Device { return c.dev }

// Handle returns the raw CUcontext.
func (c *Context) Handle() uintptr { return c.h }

// SetCurrent binds the context to the calling OS thread. The caller pins its
// goroutine first (runtime.LockOSThread): a goroutine that moves to another
// thread loses its context.
func (c *Context) SetCurrent() error { return pCtxSetCurrent.cu(c.h) }

// Release drops the reference taken by PrimaryContext; the primary context is
// destroyed (with its memory) when the last reference goes.
func (c *Context) Release() error { return pPrimaryCtxRelease.cu(uintptr(c.dev)) }

// CtxSynchronize waits until all work in the current context has finished.
func CtxSynchronize() error { return pCtxSynchronize.cu() }
