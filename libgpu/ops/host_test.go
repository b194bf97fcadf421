package ops_test

import (
	"errors"
	"math"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
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

// TestHostLabelOutOfRange: a label ≥ C is ErrLabel on the host; a
// negative one is ignored (PyTorch's ignore_index=-1): the loss is the
// other row's, log 5 for uniform logits, and the ignored row's gradient 0.
func TestHostLabelOutOfRange(t *testing.T) {
	e, a := hostEngine(t)
	for _, bad := range []int32{-1, 5} {
		labels := opstest.UploadI32(t, a, []int32{0, bad}, 2)
		logits := opstest.Upload(t, a, make([]float32, 10), 2, 5)
		loss, dl := opstest.Empty(t, a, tensor.F32, 1), opstest.Empty(t, a, tensor.F32, 2, 5)
		err := e.CrossEntropy(loss, dl, logits, labels, false)
		if bad >= 0 {
			if !errors.Is(err, ops.ErrLabel) {
				t.Errorf("label %d: error %v, want ErrLabel", bad, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("label %d: %v", bad, err)
		}
		if got := opstest.Download(t, loss)[0]; math.Abs(got-math.Log(5)) > 1e-6 {
			t.Errorf("label %d: loss %v, want log 5 (the valid row's)", bad, got)
		}
		for j, g := range opstest.Download(t, dl)[5:] {
			if g != 0 {
				t.Errorf("label %d: ignored row's gradient [%d] = %v, want 0", bad, j, g)
			}
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
	if err := e.Linear(y, xo, w, nil, nil, ops.ActNone); !errors.Is(err, exec.ErrDevice) {
		t.Fatalf("tensor on another device: error %v, want ErrDevice", err)
	}
}

func TestNoBackend(t *testing.T) {
	other := otherKind{device.NewHost()}
	if _, err := ops.NewEngine(other, ops.Options{}); !errors.Is(err, exec.ErrNoBackend) {
		t.Fatalf("error %v, want ErrNoBackend", err)
	}
}

type otherKind struct{ *device.Host }

func (otherKind) Kind() device.Kind { return device.Kind(200) }

// TestHostFamilies runs every registered op family's checks on the host.
func TestHostFamilies(t *testing.T) {
	opstest.CheckFamilies(t, device.NewHost(), ops.Options{}, nil)
}

// TestHostSeeds runs the host backend's op checks (CheckImpl and every
// family's) for several fresh seeds, each logged (GPUKIT_OPSTEST_SEEDS
// sets how many; 3 keep CI's two cores busy about a minute): comparisons
// are relative to the size of the terms summed, so they must pass for
// every seed, not most.
func TestHostSeeds(t *testing.T) {
	opstest.CheckSeeds(t, opstest.Seeds(3), device.NewHost(), ops.Options{}, 1e-5)
}
