package opstest

import (
	"math"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// PoisonI32 is the value Poison writes into i32 tensors.
const PoisonI32 = math.MinInt32

// Poison overwrites every element of a contiguous tensor through
// tensor.Write, so a test can prove an op wrote every element: f32 with NaN,
// i32 with PoisonI32, other dtypes with all-ones bytes (NaN for bf16/f16).
func Poison(t *tensor.Tensor) error {
	n := t.Numel()
	switch t.DType {
	case tensor.F32:
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.NaN())
		}
		return t.Write(tensor.AsBytes(v))
	case tensor.I32:
		v := make([]int32, n)
		for i := range v {
			v[i] = PoisonI32
		}
		return t.Write(tensor.AsBytes(v))
	}
	b := make([]byte, t.Bytes())
	for i := range b {
		b[i] = 0xff
	}
	return t.Write(b)
}

// Upload allocates a contiguous f32 tensor on a's device, writes v into it
// and frees it when the test ends.
func Upload(tb testing.TB, a device.Allocator, v []float32, shape ...int) *tensor.Tensor {
	tb.Helper()
	t := Empty(tb, a, tensor.F32, shape...)
	if err := t.WriteF32(v); err != nil {
		tb.Fatalf("upload %v: %v", shape, err)
	}
	return t
}

// UploadI32 is Upload for i32 data.
func UploadI32(tb testing.TB, a device.Allocator, v []int32, shape ...int) *tensor.Tensor {
	tb.Helper()
	t := Empty(tb, a, tensor.I32, shape...)
	if err := t.Write(tensor.AsBytes(v)); err != nil {
		tb.Fatalf("upload %v: %v", shape, err)
	}
	return t
}

// Empty allocates a poisoned contiguous tensor freed when the test ends.
func Empty(tb testing.TB, a device.Allocator, dt tensor.DType, shape ...int) *tensor.Tensor {
	tb.Helper()
	t, err := tensor.Alloc(a, "", dt, shape...)
	if err != nil {
		tb.Fatalf("alloc %v %v: %v", dt, shape, err)
	}
	tb.Cleanup(func() { t.Buf.Free() })
	if err := Poison(t); err != nil {
		tb.Fatalf("poison: %v", err)
	}
	return t
}

// Download waits for the device and reads an f32 tensor as float64.
func Download(tb testing.TB, t *tensor.Tensor) []float64 {
	tb.Helper()
	return F64(tensor.BytesAs[float32](readSynced(tb, t, tensor.F32)))
}

// DownloadI32 waits for the device and reads an i32 tensor.
func DownloadI32(tb testing.TB, t *tensor.Tensor) []int32 {
	tb.Helper()
	return append([]int32(nil), tensor.BytesAs[int32](readSynced(tb, t, tensor.I32))...)
}

// readSynced waits for t's device and copies out t's bytes, failing the test
// unless t has dtype dt.
func readSynced(tb testing.TB, t *tensor.Tensor, dt tensor.DType) []byte {
	tb.Helper()
	if t.DType != dt {
		tb.Fatalf("read %v: want %v", t, dt)
	}
	if err := t.Device().Sync(); err != nil {
		tb.Fatalf("sync: %v", err)
	}
	b, err := t.Read()
	if err != nil {
		tb.Fatalf("read %v: %v", t, err)
	}
	return b
}

// UploadU8 is Upload for u8 data.
func UploadU8(tb testing.TB, a device.Allocator, v []uint8, shape ...int) *tensor.Tensor {
	tb.Helper()
	t := Empty(tb, a, tensor.U8, shape...)
	if err := t.Write(v); err != nil {
		tb.Fatalf("upload %v: %v", shape, err)
	}
	return t
}

// DownloadU8 waits for the device and reads a u8 tensor.
func DownloadU8(tb testing.TB, t *tensor.Tensor) []uint8 {
	tb.Helper()
	return readSynced(tb, t, tensor.U8)
}

// PoisonAlloc is a host device.Allocator for tests: it records every name it
// is asked for (Names) and fills each new buffer with 0xff bytes (NaN as
// f32), so a test cannot pass on memfd's zero pages: whatever a model or an
// optimizer reads must have been written.
type PoisonAlloc struct {
	Dev   device.Device
	Names []string
}

// Alloc implements device.Allocator.
func (p *PoisonAlloc) Alloc(name string, size int64) (*device.Buffer, error) {
	b, err := p.Dev.Alloc(size)
	if err != nil {
		return nil, err
	}
	for i := range b.Bytes() {
		b.Bytes()[i] = 0xff
	}
	p.Names = append(p.Names, name)
	return b, nil
}

// Device implements device.Allocator.
func (p *PoisonAlloc) Device() device.Device { return p.Dev }
