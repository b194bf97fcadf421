package tensor

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"gpukit/libgpu/device"
)

// DType is an element type.
type DType uint8

// Element types. BF16 and F16 are stored as raw 16-bit patterns.
const (
	F32 DType = iota + 1
	BF16
	F16
	I32
	I64
	U8
)

var dtypeNames = map[DType]string{F32: "f32", BF16: "bf16", F16: "f16", I32: "i32", I64: "i64", U8: "u8"}

// Size is the number of bytes of one element.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16, F16:
		return 2
	case I64:
		return 8
	case U8:
		return 1
	}
	return 0
}

func (d DType) String() string {
	if s, ok := dtypeNames[d]; ok {
		return s
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// SafetensorsName is the dtype's name in the safetensors header ("F32", "BF16", ...).
func (d DType) SafetensorsName() string { return strings.ToUpper(d.String()) }

// ParseDType accepts "f32", "bf16", ... and the safetensors spellings ("F32", "BF16").
func ParseDType(s string) (DType, error) {
	ls := strings.ToLower(s)
	for d, n := range dtypeNames {
		if n == ls {
			return d, nil
		}
	}
	return 0, fmt.Errorf("%w: %q (want f32, bf16, f16, i32, i64 or u8)", ErrDType, s)
}

// Errors.
var (
	ErrShape  = errors.New("tensor: shape mismatch")
	ErrDType  = errors.New("tensor: unsupported dtype")
	ErrLayout = errors.New("tensor: not contiguous")
	ErrHost   = errors.New("tensor: not host memory")
)

// Tensor is a typed strided view over a buffer.
type Tensor struct {
	Buf     *device.Buffer
	DType   DType
	Shape   []int
	Strides []int // in elements
	Offset  int   // in elements
}

// Numel is the product of the shape (1 for a scalar).
func Numel(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

// RowMajor returns contiguous strides for shape.
func RowMajor(shape []int) []int {
	st := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= shape[i]
	}
	return st
}

// New views buf as a contiguous tensor of the given dtype and shape starting
// at element 0. It fails when buf is too small or a dimension is negative.
func New(buf *device.Buffer, dt DType, shape ...int) (*Tensor, error) {
	if dt.Size() == 0 {
		return nil, fmt.Errorf("%w: %v", ErrDType, dt)
	}
	for _, s := range shape {
		if s < 0 {
			return nil, fmt.Errorf("%w: negative dimension in %v", ErrShape, shape)
		}
	}
	need := int64(Numel(shape) * dt.Size())
	if buf.Size() < need {
		return nil, fmt.Errorf("%w: %v %v needs %d bytes, buffer has %d", ErrShape, dt, shape, need, buf.Size())
	}
	return &Tensor{Buf: buf, DType: dt, Shape: append([]int(nil), shape...), Strides: RowMajor(shape)}, nil
}

// Alloc allocates a contiguous tensor through a (named when the allocator
// keeps names).
func Alloc(a device.Allocator, name string, dt DType, shape ...int) (*Tensor, error) {
	n := int64(Numel(shape) * dt.Size())
	if n == 0 {
		n = int64(dt.Size())
	}
	buf, err := a.Alloc(name, n)
	if err != nil {
		return nil, err
	}
	t, err := New(buf, dt, shape...)
	if err != nil {
		buf.Free()
		return nil, err
	}
	return t, nil
}

// Numel is the number of elements.
func (t *Tensor) Numel() int { return Numel(t.Shape) }

// Bytes is the number of bytes the elements occupy when contiguous.
func (t *Tensor) Bytes() int64 { return int64(t.Numel() * t.DType.Size()) }

// ByteOffset is the offset of element 0 in the buffer.
func (t *Tensor) ByteOffset() int64 { return int64(t.Offset * t.DType.Size()) }

// Ptr is the address (host or device) of element 0.
func (t *Tensor) Ptr() uintptr { return t.Buf.Ptr() + uintptr(t.ByteOffset()) }

// Device is the device of the buffer.
func (t *Tensor) Device() device.Device { return t.Buf.Device() }

// Contiguous reports whether the strides are row-major.
func (t *Tensor) Contiguous() bool {
	acc := 1
	for i := len(t.Shape) - 1; i >= 0; i-- {
		if t.Shape[i] != 1 && t.Strides[i] != acc {
			return false
		}
		acc *= t.Shape[i]
	}
	return true
}

// Reshape returns a view with a new shape of the same element count; t must be contiguous.
func (t *Tensor) Reshape(shape ...int) (*Tensor, error) {
	if !t.Contiguous() {
		return nil, ErrLayout
	}
	if Numel(shape) != t.Numel() {
		return nil, fmt.Errorf("%w: reshape %v to %v", ErrShape, t.Shape, shape)
	}
	return &Tensor{Buf: t.Buf, DType: t.DType, Shape: append([]int(nil), shape...), Strides: RowMajor(shape), Offset: t.Offset}, nil
}

// Rows returns the view of rows [lo, hi) along dimension 0.
func (t *Tensor) Rows(lo, hi int) (*Tensor, error) {
	if len(t.Shape) == 0 || lo < 0 || hi < lo || hi > t.Shape[0] {
		return nil, fmt.Errorf("%w: rows [%d,%d) of %v", ErrShape, lo, hi, t.Shape)
	}
	shape := append([]int(nil), t.Shape...)
	shape[0] = hi - lo
	return &Tensor{Buf: t.Buf, DType: t.DType, Shape: shape, Strides: append([]int(nil), t.Strides...), Offset: t.Offset + lo*t.Strides[0]}, nil
}

// SameShape reports whether a and b have equal shapes.
func SameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// CheckShape returns ErrShape naming what when t's shape is not want.
func (t *Tensor) CheckShape(what string, dt DType, want ...int) error {
	if t == nil {
		return fmt.Errorf("%w: %s is missing", ErrShape, what)
	}
	if t.DType != dt {
		return fmt.Errorf("%w: %s is %v, want %v", ErrDType, what, t.DType, dt)
	}
	if !SameShape(t.Shape, want) {
		return fmt.Errorf("%w: %s is %v, want %v", ErrShape, what, t.Shape, want)
	}
	return nil
}

func (t *Tensor) String() string {
	return fmt.Sprintf("Tensor(%v %v on %v)", t.DType, t.Shape, t.Buf.Device())
}

func hostSlice[T any](t *Tensor, dt DType) ([]T, error) {
	if t.DType != dt {
		return nil, fmt.Errorf("%w: tensor is %v, want %v", ErrDType, t.DType, dt)
	}
	b := t.Buf.Bytes()
	if b == nil {
		return nil, fmt.Errorf("%w: %v", ErrHost, t)
	}
	if !t.Contiguous() {
		return nil, ErrLayout
	}
	n := t.Numel()
	off := t.ByteOffset()
	if off+int64(n*dt.Size()) > int64(len(b)) {
		return nil, fmt.Errorf("%w: view past end of buffer", ErrShape)
	}
	if n == 0 {
		return []T{}, nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[off])), n), nil
}

// F32 is the elements of a contiguous host f32 tensor, aliasing its memory.
func (t *Tensor) F32() ([]float32, error) { return hostSlice[float32](t, F32) }

// I32 is the elements of a contiguous host i32 tensor, aliasing its memory.
func (t *Tensor) I32() ([]int32, error) { return hostSlice[int32](t, I32) }

// I64 is the elements of a contiguous host i64 tensor, aliasing its memory.
func (t *Tensor) I64() ([]int64, error) { return hostSlice[int64](t, I64) }

// U8 is the elements of a contiguous host u8 tensor, aliasing its memory.
func (t *Tensor) U8() ([]uint8, error) { return hostSlice[uint8](t, U8) }

// U16 is the raw 16-bit elements of a contiguous host bf16 or f16 tensor.
func (t *Tensor) U16() ([]uint16, error) {
	if t.DType != BF16 && t.DType != F16 {
		return nil, fmt.Errorf("%w: tensor is %v, want bf16 or f16", ErrDType, t.DType)
	}
	return hostSlice[uint16](&Tensor{Buf: t.Buf, DType: t.DType, Shape: t.Shape, Strides: t.Strides, Offset: t.Offset}, t.DType)
}

// Read copies the tensor's bytes (contiguous) to host memory, from any device.
func (t *Tensor) Read() ([]byte, error) {
	if !t.Contiguous() {
		return nil, ErrLayout
	}
	out := make([]byte, t.Bytes())
	if err := t.Device().CopyOut(out, t.Buf, t.ByteOffset()); err != nil {
		return nil, err
	}
	return out, nil
}

// Write copies host bytes (exactly t.Bytes() of them) into the tensor, on any device.
func (t *Tensor) Write(src []byte) error {
	if !t.Contiguous() {
		return ErrLayout
	}
	if int64(len(src)) != t.Bytes() {
		return fmt.Errorf("%w: writing %d bytes into %v (%d bytes)", ErrShape, len(src), t, t.Bytes())
	}
	return t.Device().CopyIn(t.Buf, t.ByteOffset(), src)
}

// ReadF32 copies an f32 tensor to a new host slice, from any device.
func (t *Tensor) ReadF32() ([]float32, error) {
	if t.DType != F32 {
		return nil, fmt.Errorf("%w: tensor is %v, want f32", ErrDType, t.DType)
	}
	b, err := t.Read()
	if err != nil {
		return nil, err
	}
	return BytesAs[float32](b), nil
}

// WriteF32 copies host floats into an f32 tensor on any device.
func (t *Tensor) WriteF32(v []float32) error {
	if t.DType != F32 {
		return fmt.Errorf("%w: tensor is %v, want f32", ErrDType, t.DType)
	}
	return t.Write(AsBytes(v))
}

// AsBytes views a slice of fixed-size values as bytes (no copy).
func AsBytes[T any](v []T) []byte {
	if len(v) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*int(unsafe.Sizeof(z)))
}

// BytesAs views bytes as a slice of T (no copy); len(b) must be a multiple of T's size
// and b suitably aligned (slices from make and mmap are).
func BytesAs[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}
