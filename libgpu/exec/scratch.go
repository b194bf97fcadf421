package exec

import (
	"unsafe"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// ScratchTensor returns a contiguous tensor of dtype dt and shape over the
// backend's scratch slot name (contents undefined): on CUDA the slot of
// CUDA.Scratch (on the current stream's namespace, grown, never shrunk;
// refused while capturing if it must grow), on the host Go memory kept
// per slot (Host.Scratch). Composite ops (the matrix roots) use it for
// intermediates; a slot holds one tensor at a time, so an op uses one
// slot per live intermediate.
func (e *Engine) ScratchTensor(name string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	size := int64(max(tensor.Numel(shape)*dt.Size(), 1))
	var buf *device.Buffer
	err := e.Dispatch(func(h *Host) error {
		b := h.Scratch(name, size)
		buf = device.NewBuffer(e.dev, uintptr(unsafe.Pointer(&b[0])), size, b, device.Shareable{FD: -1}, nil) // b: on the heap (made), kept by the Buffer
		return nil
	}, func(c *CUDA) error {
		p, err := c.Scratch(name, size)
		if err != nil {
			return err
		}
		buf = device.NewBuffer(e.dev, uintptr(p), size, nil, device.Shareable{FD: -1}, nil)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return tensor.New(buf, dt, shape...)
}
