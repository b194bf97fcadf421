package ops_test

import (
	"errors"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

func TestHostImpl(t *testing.T) {
	opstest.CheckImpl(t, device.NewHost(), ops.Options{}, 1e-5)
}

// The host backend computes TF32 and BF16 requests in f32.
func TestHostImplTF32(t *testing.T) {
	opstest.CheckImpl(t, device.NewHost(), ops.Options{Precision: ops.PrecTF32}, 1e-5)
}

func hostEngine(t *testing.T) (*ops.Engine, device.Allocator) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e, device.Local{Dev: h}
}

func TestHostLabelOutOfRange(t *testing.T) {
	e, a := hostEngine(t)
	for _, bad := range []int32{-1, 5} {
		labels := opstest.UploadI32(t, a, []int32{0, bad}, 2)
		logits := opstest.Upload(t, a, make([]float32, 10), 2, 5)
		err := e.SoftmaxCrossEntropy(opstest.Empty(t, a, tensor.F32, 1), opstest.Empty(t, a, tensor.F32, 2, 5), logits, labels)
		if !errors.Is(err, ops.ErrLabel) {
			t.Errorf("label %d: error %v, want ErrLabel", bad, err)
		}
	}
}

// otherDevice is a host device under another name, to test ErrDevice.
type otherDevice struct{ *device.Host }

func (otherDevice) String() string { return "other" }

func TestEngineRejectsOtherDevice(t *testing.T) {
	e, a := hostEngine(t)
	other := otherDevice{device.NewHost()}
	buf, err := other.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	foreign := device.NewBuffer(other, buf.Ptr(), buf.Size(), buf.Bytes(), buf.Share(), nil)
	xo, err := tensor.New(foreign, tensor.F32, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	w := opstest.Upload(t, a, make([]float32, 12), 4, 3)
	y := opstest.Empty(t, a, tensor.F32, 2, 4)
	if err := e.Linear(y, xo, w, nil, nil, ops.ActNone); !errors.Is(err, ops.ErrDevice) {
		t.Fatalf("tensor on another device: error %v, want ErrDevice", err)
	}
}

func TestNoBackend(t *testing.T) {
	other := otherKind{device.NewHost()}
	if _, err := ops.NewEngine(other, ops.Options{}); !errors.Is(err, ops.ErrNoBackend) {
		t.Fatalf("error %v, want ErrNoBackend", err)
	}
}

type otherKind struct{ *device.Host }

func (otherKind) Kind() device.Kind { return device.Kind(200) }

// TestHostFamilies runs every registered op family's checks on the host.
func TestHostFamilies(t *testing.T) {
	opstest.CheckFamilies(t, device.NewHost(), ops.Options{}, nil)
}
