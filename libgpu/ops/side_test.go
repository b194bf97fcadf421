package ops_test

import (
	"errors"
	"testing"

	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// TestHostSide: the host backend has no second stream: Side runs its
// function in line (its error comes back), Join and WaitEvent do nothing,
// and an event is always complete.
func TestHostSide(t *testing.T) {
	e, a := hostEngine(t)
	if e.HasSide() {
		t.Error("host HasSide")
	}
	x := opstest.Upload(t, a, []float32{1, 2, 3, 4}, 2, 2)
	y := opstest.Empty(t, a, tensor.F32, 2, 2)
	ran := false
	if err := e.Side(func() error { ran = true; return e.Matmul(ops.Matmul{A: x, B: x, D: y}) }); err != nil || !ran {
		t.Fatalf("Side: ran %v, %v", ran, err)
	}
	if got, _ := y.ReadF32(); got[0] != 7 || got[3] != 22 {
		t.Errorf("x·x = %v", got)
	}
	boom := errors.New("boom")
	if err := e.Side(func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Side's error: %v", err)
	}
	ev, err := e.NewEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if err := ev.Record(); err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); !done || err != nil {
		t.Errorf("Query: %v, %v", done, err)
	}
	if err := e.WaitEvent(ev); err != nil {
		t.Error(err)
	}
	if err := e.WaitEvent(nil); !errors.Is(err, exec.ErrConfig) {
		t.Errorf("WaitEvent(nil): %v", err)
	}
	if err := e.Join(); err != nil {
		t.Error(err)
	}
}
