package exec

import (
	"fmt"
	"math"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// Staging is host memory for copies queued on the engine: page-locked on a
// GPU (so copies run asynchronously, overlapping host work), ordinary
// memory on the host.
type Staging struct {
	e    *Engine
	p    unsafe.Pointer
	b    []byte
	host bool
}

// NewStaging allocates n bytes of staging memory.
func (e *Engine) NewStaging(n int64) (*Staging, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: staging of %d bytes", device.ErrBadSize, n)
	}
	c := e.cuda
	if c == nil {
		words := make([]uint64, (n+7)/8)
		return &Staging{e: e, b: tensor.AsBytes(words)[:n], host: true}, nil
	}
	s := &Staging{e: e}
	err := c.Do(func() error {
		p, err := cuda.MemHostAlloc(n)
		s.p = p
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("exec: pinned staging of %d bytes: %w", n, err)
	}
	s.b = unsafe.Slice((*byte)(s.p), n)
	return s, nil
}

// Bytes is the staging memory.
func (s *Staging) Bytes() []byte { return s.b }

// Close frees the staging memory.
func (s *Staging) Close() error {
	if s.host || s.p == nil {
		s.b = nil
		return nil
	}
	err := s.e.Do(func() error { return cuda.MemFreeHost(s.p) })
	s.p, s.b = nil, nil
	return err
}

// devPtr is the device address of element 0 of t.
func devPtr(t *tensor.Tensor) cuda.DevicePtr {
	if t == nil {
		return 0
	}
	return cuda.DevicePtr(t.Ptr())
}

// CopyIn queues the copy of dst.Bytes() bytes from s at byte offset off
// into the contiguous tensor dst, in order with the engine's work (on the
// host it copies at once). The staging memory must not be rewritten until
// the copy has run (record an event after it and wait for it).
func (e *Engine) CopyIn(dst *tensor.Tensor, s *Staging, off int64) error {
	if err := e.checkCopy("copy-in destination", dst, s, off); err != nil {
		return err
	}
	src := s.b[off : off+dst.Bytes()]
	c := e.cuda
	if c == nil {
		return dst.Write(src)
	}
	return c.Do(func() error {
		return cuda.MemcpyHtoDAsync(devPtr(dst), unsafe.Pointer(&src[0]), dst.Bytes(), c.stream)
	})
}

// CopyOut queues the copy of the contiguous tensor src into s at byte
// offset off, in order with the engine's work; read s after an event
// recorded behind it has completed (on the host it copies at once).
func (e *Engine) CopyOut(s *Staging, off int64, src *tensor.Tensor) error {
	if err := e.checkCopy("copy-out source", src, s, off); err != nil {
		return err
	}
	dst := s.b[off : off+src.Bytes()]
	c := e.cuda
	if c == nil {
		b, err := src.Read()
		copy(dst, b)
		return err
	}
	return c.Do(func() error {
		return cuda.MemcpyDtoHAsync(unsafe.Pointer(&dst[0]), devPtr(src), src.Bytes(), c.stream)
	})
}

func (e *Engine) checkCopy(what string, t *tensor.Tensor, s *Staging, off int64) error {
	if t == nil || s == nil || s.b == nil {
		return fmt.Errorf("%w: %s: missing tensor or staging", tensor.ErrShape, what)
	}
	if err := e.CheckPlace(what, t); err != nil {
		return err
	}
	if off < 0 || off+t.Bytes() > int64(len(s.b)) || t.Bytes() == 0 {
		return fmt.Errorf("%w: %s of %d bytes at offset %d of %d staging bytes", device.ErrRange, what, t.Bytes(), off, len(s.b))
	}
	return nil
}

// Copy queues dst ← src for two contiguous tensors of the same dtype and
// size on the engine's device, in order with the engine's work.
func (e *Engine) Copy(dst, src *tensor.Tensor) error {
	if err := e.CheckPlace("copy destination", dst); err != nil {
		return err
	}
	if err := e.CheckPlace("copy source", src); err != nil {
		return err
	}
	if dst.DType != src.DType || dst.Bytes() != src.Bytes() {
		return fmt.Errorf("%w: copy %v %v into %v %v", tensor.ErrShape, src.DType, src.Shape, dst.DType, dst.Shape)
	}
	if dst.Bytes() == 0 {
		return nil
	}
	return e.Dispatch(func(*Host) error {
		b, err := src.Read()
		if err != nil {
			return err
		}
		return dst.Write(b)
	}, func(c *CUDA) error {
		return cuda.MemcpyDtoDAsync(devPtr(dst), devPtr(src), dst.Bytes(), c.stream)
	})
}

// Fill sets every element of a contiguous f32 or i32 tensor to v
// (converted to the dtype; for i32, v must be an integer in range, else
// ErrConfig), in order with the engine's work: on CUDA a cuMemsetD32Async
// of the value's 32-bit pattern, which a captured graph records as a
// memset node.
func (e *Engine) Fill(t *tensor.Tensor, v float64) error {
	if t == nil {
		return fmt.Errorf("%w: fill tensor is missing", tensor.ErrShape)
	}
	var bits uint32
	switch t.DType {
	case tensor.F32:
		bits = math.Float32bits(float32(v))
	case tensor.I32:
		if v != float64(int32(v)) {
			return fmt.Errorf("%w: fill value %v is not an i32", ErrConfig, v)
		}
		bits = uint32(int32(v))
	default:
		return fmt.Errorf("%w: fill of %v (want f32 or i32)", tensor.ErrDType, t.DType)
	}
	if err := e.CheckPlace("fill tensor", t); err != nil {
		return err
	}
	if t.Numel() == 0 {
		return nil
	}
	return e.Dispatch(func(*Host) error {
		switch t.DType {
		case tensor.F32:
			s, err := t.F32()
			if err != nil {
				return fmt.Errorf("exec: host backend: %w", err)
			}
			f := float32(v)
			for i := range s {
				s[i] = f
			}
		default:
			s, err := t.I32()
			if err != nil {
				return fmt.Errorf("exec: host backend: %w", err)
			}
			for i := range s {
				s[i] = int32(v)
			}
		}
		return nil
	}, func(c *CUDA) error {
		return cuda.MemsetD32Async(devPtr(t), bits, int64(t.Numel()), c.stream)
	})
}
