package exec_test

import (
	"errors"
	"slices"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/tensor"
)

func hostEngine(t *testing.T) (*exec.Engine, device.Allocator) {
	t.Helper()
	h := device.NewHost()
	e, err := exec.NewEngine(h, exec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return e, device.Local{Dev: h}
}

func alloc(t *testing.T, a device.Allocator, dt tensor.DType, shape ...int) *tensor.Tensor {
	t.Helper()
	x, err := tensor.Alloc(a, "", dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Buf.Free() })
	return x
}

// otherKind is a device of a kind no backend serves.
type otherKind struct{ *device.Host }

func (otherKind) Kind() device.Kind { return device.Kind(77) }

// relabel allocates host memory labelled as its device's.
type relabel struct{ dev otherKind }

func (a relabel) Alloc(_ string, size int64) (*device.Buffer, error) {
	b, err := a.dev.Host.Alloc(size)
	if err != nil {
		return nil, err
	}
	return device.NewBuffer(a.dev, b.Ptr(), b.Size(), b.Bytes(), b.Share(), b.Free), nil
}

func (a relabel) Device() device.Device { return a.dev }

func TestNewEngineBackends(t *testing.T) {
	e, _ := hostEngine(t)
	if e.Host() == nil || e.CUDA() != nil || e.IsGraphCapable() || e.HasSide() || e.Stream() != 0 {
		t.Fatalf("host engine: host %v, cuda %v, graph %v, side %v, stream %v", e.Host(), e.CUDA(), e.IsGraphCapable(), e.HasSide(), e.Stream())
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.NewEngine(otherKind{device.NewHost()}, exec.Options{}); !errors.Is(err, exec.ErrNoBackend) {
		t.Fatalf("unknown device kind: %v, want ErrNoBackend", err)
	}
	if err := e.Dispatch(nil, func(*exec.CUDA) error { return nil }); !errors.Is(err, exec.ErrNoBackend) {
		t.Fatalf("Dispatch without a host function: %v, want ErrNoBackend", err)
	}
	ran := false
	if err := e.Dispatch(func(*exec.Host) error { ran = true; return nil }, nil); err != nil || !ran {
		t.Fatalf("Dispatch on the host: ran %v, %v", ran, err)
	}
}

// TestHostCaptureReplays: on the host a captured graph is its function,
// called by every Launch, and refused after Close.
func TestHostCaptureReplays(t *testing.T) {
	e, a := hostEngine(t)
	x := alloc(t, a, tensor.F32, 3)
	n := 0
	g, err := e.Capture(func() error { n++; return e.Fill(x, float64(n)) })
	if err != nil || n != 0 {
		t.Fatalf("Capture ran f %d times: %v", n, err)
	}
	for i := 1; i <= 3; i++ {
		if err := g.Launch(); err != nil {
			t.Fatal(err)
		}
		if v, _ := x.F32(); !slices.Equal(v, []float32{float32(i), float32(i), float32(i)}) {
			t.Fatalf("replay %d: x = %v", i, v)
		}
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.Launch(); !errors.Is(err, exec.ErrCapture) {
		t.Fatalf("Launch after Close: %v, want ErrCapture", err)
	}
}

func TestHostStagingCopies(t *testing.T) {
	e, a := hostEngine(t)
	s, err := e.NewStaging(64)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := []int32{3, -1, 4, 1, -5}
	copy(s.Bytes()[8:], tensor.AsBytes(src))
	x := alloc(t, a, tensor.I32, 5)
	if err := e.CopyIn(x, s, 8); err != nil {
		t.Fatal(err)
	}
	y := alloc(t, a, tensor.I32, 5)
	if err := e.Copy(y, x); err != nil {
		t.Fatal(err)
	}
	if err := e.CopyOut(s, 40, y); err != nil {
		t.Fatal(err)
	}
	if got := tensor.BytesAs[int32](s.Bytes()[40:60]); !slices.Equal(got, src) {
		t.Fatalf("round trip %v, want %v", got, src)
	}
	if err := e.CopyIn(x, s, 48); !errors.Is(err, device.ErrRange) {
		t.Fatalf("copy past the staging memory: %v, want ErrRange", err)
	}
	if err := e.Copy(alloc(t, a, tensor.F32, 5), x); !errors.Is(err, tensor.ErrShape) {
		t.Fatalf("copy across dtypes: %v, want ErrShape", err)
	}
	if _, err := e.NewStaging(0); !errors.Is(err, device.ErrBadSize) {
		t.Fatalf("empty staging: %v, want ErrBadSize", err)
	}
}

func TestHostFill(t *testing.T) {
	e, a := hostEngine(t)
	f := alloc(t, a, tensor.F32, 4)
	if err := e.Fill(f, -2.5); err != nil {
		t.Fatal(err)
	}
	if v, _ := f.F32(); !slices.Equal(v, []float32{-2.5, -2.5, -2.5, -2.5}) {
		t.Fatalf("f32 fill %v", v)
	}
	i := alloc(t, a, tensor.I32, 2)
	if err := e.Fill(i, 7); err != nil {
		t.Fatal(err)
	}
	if v, _ := i.I32(); !slices.Equal(v, []int32{7, 7}) {
		t.Fatalf("i32 fill %v", v)
	}
	if err := e.Fill(i, 0.5); !errors.Is(err, exec.ErrConfig) {
		t.Fatalf("i32 fill of 0.5: %v, want ErrConfig", err)
	}
	if err := e.Fill(alloc(t, a, tensor.BF16, 2), 1); !errors.Is(err, tensor.ErrDType) {
		t.Fatalf("bf16 fill: %v, want ErrDType", err)
	}
}

// TestHostEventsAndSide: host events are always complete, Side runs its
// function in line, Join and WaitEvent do nothing but WaitEvent refuses
// a nil event.
func TestHostEventsAndSide(t *testing.T) {
	e, _ := hostEngine(t)
	v, err := e.NewEvent(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Record(); err != nil {
		t.Fatal(err)
	}
	if done, err := v.Query(); !done || err != nil {
		t.Fatalf("Query %v, %v", done, err)
	}
	if ms, err := v.Elapsed(v); ms != 0 || err != nil {
		t.Fatalf("Elapsed %v, %v", ms, err)
	}
	ran := false
	if err := e.Side(func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Side ran %v: %v", ran, err)
	}
	if err := e.Join(); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitEvent(v); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitEvent(nil); !errors.Is(err, exec.ErrConfig) {
		t.Fatalf("WaitEvent(nil): %v, want ErrConfig", err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestStateOf: one value per type and backend, made on first use.
func TestStateOf(t *testing.T) {
	type a struct{ n int }
	type b struct{ n int }
	e1, _ := hostEngine(t)
	e2, _ := hostEngine(t)
	exec.StateOf[a](e1.Host()).n = 1
	exec.StateOf[b](e1.Host()).n = 2
	if exec.StateOf[a](e1.Host()).n != 1 || exec.StateOf[b](e1.Host()).n != 2 {
		t.Fatal("state not kept per type")
	}
	if exec.StateOf[a](e2.Host()).n != 0 {
		t.Fatal("state shared between engines")
	}
}

// TestHostScratchTensor: a slot's memory is reused for the same name and
// grown when asked for more.
func TestHostScratchTensor(t *testing.T) {
	e, _ := hostEngine(t)
	x, err := e.ScratchTensor("s", tensor.F32, 4)
	if err != nil {
		t.Fatal(err)
	}
	y, err := e.ScratchTensor("s", tensor.F32, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if x.Ptr() != y.Ptr() {
		t.Fatal("one slot gave two buffers")
	}
	z, err := e.ScratchTensor("other", tensor.I32, 4)
	if err != nil {
		t.Fatal(err)
	}
	if z.Ptr() == x.Ptr() {
		t.Fatal("two slots share a buffer")
	}
	big, err := e.ScratchTensor("s", tensor.F32, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if big.Bytes() != 4000 || big.Buf.Size() < 4000 {
		t.Fatalf("grown slot of %d bytes in a buffer of %d", big.Bytes(), big.Buf.Size())
	}
}

// TestCheckPlace: the checks the op families build on.
func TestCheckPlace(t *testing.T) {
	e, a := hostEngine(t)
	x := alloc(t, a, tensor.F32, 4, 6)
	if err := e.CheckPlace("x", x); err != nil {
		t.Fatal(err)
	}
	tr, err := x.Permute(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.CheckPlace("xᵀ", tr); !errors.Is(err, tensor.ErrLayout) {
		t.Fatalf("a transposed view: %v, want ErrLayout", err)
	}
	other := alloc(t, relabel{otherKind{device.NewHost()}}, tensor.F32, 2)
	if err := e.CheckPlace("other", other); !errors.Is(err, exec.ErrDevice) {
		t.Fatalf("a tensor on another device: %v, want ErrDevice", err)
	}
	if err := e.CheckScalar("s", x, tensor.F32); !errors.Is(err, tensor.ErrShape) {
		t.Fatalf("CheckScalar of [4,6]: %v, want ErrShape", err)
	}
	if err := e.CheckScalar("s", alloc(t, a, tensor.I32, 1), tensor.F32); !errors.Is(err, tensor.ErrDType) {
		t.Fatalf("CheckScalar of an i32 for f32: %v, want ErrDType", err)
	}
}
