package ops_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// TestCUDASide queues GEMMs on the side stream (its own workspace), joins
// them with WaitEvent and with Join, and checks the results are bitwise
// those of the same GEMMs on the main stream; then captures a fork and
// join into a graph and replays it. AdamW inside Side is refused.
func TestCUDASide(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	a := device.Local{Dev: d}
	if !e.HasSide() {
		t.Fatal("CUDA engine without a side stream")
	}
	const n = 257
	x := opstest.Upload(t, a, sideVec(n*n), n, n)
	want := opstest.Empty(t, a, tensor.F32, n, n)
	side := opstest.Empty(t, a, tensor.F32, n, n)
	other := opstest.Empty(t, a, tensor.F32, n, n)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("main", e.Matmul(ops.Matmul{A: x, B: x, D: want}))
	ev, err := e.NewEvent(false)
	must("event", err)
	defer ev.Close()
	must("side", e.Side(func() error {
		if err := e.Matmul(ops.Matmul{A: x, B: x, D: side}); err != nil {
			return err
		}
		return ev.Record()
	}))
	must("main meanwhile", e.Matmul(ops.Matmul{A: x, B: x, D: other, TransB: true}))
	must("wait", e.WaitEvent(ev))
	must("join", e.Join())
	must("sync", e.Sync())
	w, _ := want.ReadF32()
	s, _ := side.ReadF32()
	for i := range w {
		if w[i] != s[i] {
			t.Fatalf("side GEMM [%d] = %v, main %v", i, s[i], w[i])
		}
	}
	// A fork and join inside a capture, replayed.
	must("fill", e.Fill(side, 0))
	g, err := e.Capture(func() error {
		if err := e.Side(func() error { return e.Matmul(ops.Matmul{A: x, B: x, D: side}) }); err != nil {
			return err
		}
		return e.Join()
	})
	must("capture", err)
	defer g.Close()
	must("launch", g.Launch())
	must("sync", e.Sync())
	s, _ = side.ReadF32()
	for i := range w {
		if w[i] != s[i] {
			t.Fatalf("replayed side GEMM [%d] = %v, main %v", i, s[i], w[i])
		}
	}
	// Shared backend state is refused on the side.
	p := opstest.Upload(t, a, []float32{1}, 1)
	st := opstest.UploadI32(t, a, []int32{0}, 1)
	err = e.Side(func() error {
		return e.AdamW([]*tensor.Tensor{p}, []*tensor.Tensor{p}, []*tensor.Tensor{p}, []*tensor.Tensor{p}, st, ops.DefaultAdamW)
	})
	if !errors.Is(err, exec.ErrSide) {
		t.Errorf("AdamW inside Side: %v, want ErrSide", err)
	}
	if err := e.Side(func() error { return e.Side(func() error { return nil }) }); !errors.Is(err, exec.ErrSide) {
		t.Errorf("nested Side: %v, want ErrSide", err)
	}
	must("join", e.Join())
}

// TestCUDACommSide: work queued with CommSide starts after what the main
// stream and the side stream queued before it (a copy of a long side-stream
// GEMM's result sees the whole result, eagerly and replayed from a
// capture), runs beside later side-stream work, and JoinComm orders it
// before what the main stream queues next; nesting is refused.
func TestCUDACommSide(t *testing.T) {
	d := gpu(t)
	for _, high := range []bool{false, true} {
		t.Run(fmt.Sprintf("high priority %v", high), func(t *testing.T) {
			e, err := ops.NewEngine(d, ops.Options{Precision: ops.PrecF32, HighPriorityComm: high})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			commSide(t, d, e)
			prio, greatest, err := e.CommStreamPriority()
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{false: 0, true: greatest}[high]; prio != want {
				t.Errorf("communication stream priority %d, want %d (greatest %d)", prio, want, greatest)
			}
		})
	}
}

// commSide is TestCUDACommSide on engine e.
func commSide(t *testing.T, d device.Device, e *ops.Engine) {
	a := device.Local{Dev: d}
	const n = 1536 // an f32 GEMM of ~7 GFLOP: long enough for a copy that did not wait to see it unfinished
	x := opstest.Upload(t, a, sideVec(n*n), n, n)
	want := opstest.Empty(t, a, tensor.F32, n, n)
	side := opstest.Empty(t, a, tensor.F32, n, n)
	got := opstest.Empty(t, a, tensor.F32, n, n)
	later := opstest.Empty(t, a, tensor.F32, n, n)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	must("main", e.Matmul(ops.Matmul{A: x, B: x, D: want}))
	must("sync", e.Sync())
	w, _ := want.ReadF32()
	step := func() error {
		if err := e.Fill(got, 0); err != nil {
			return err
		}
		if err := e.Side(func() error { return e.Matmul(ops.Matmul{A: x, B: x, D: side}) }); err != nil {
			return err
		}
		if err := e.CommSide(func() error { return e.Copy(got, side) }); err != nil {
			return err
		}
		// More side work meanwhile (it must not be ordered behind the copy
		// for correctness; it only has to finish before the join).
		if err := e.Side(func() error { return e.Matmul(ops.Matmul{A: x, B: x, D: later, TransB: true}) }); err != nil {
			return err
		}
		if err := e.Join(); err != nil {
			return err
		}
		return e.JoinComm()
	}
	check := func(what string) {
		t.Helper()
		must("sync", e.Sync())
		g, _ := got.ReadF32()
		for i := range w {
			if g[i] != w[i] {
				t.Fatalf("%s: the copy on the communication stream [%d] = %v, the GEMM's %v", what, i, g[i], w[i])
			}
		}
	}
	must("eager", step())
	check("eager")
	must("clear", e.Fill(side, 0))
	graph, err := e.Capture(step)
	must("capture", err)
	defer graph.Close()
	for k := range 3 {
		must("clear", e.Fill(side, 0))
		must("launch", graph.Launch())
		check(fmt.Sprint("replay ", k+1))
	}
	if err := e.CommSide(func() error { return e.Side(func() error { return nil }) }); !errors.Is(err, exec.ErrSide) {
		t.Errorf("Side inside CommSide: %v, want ErrSide", err)
	}
	if err := e.Side(func() error { return e.CommSide(func() error { return nil }) }); !errors.Is(err, exec.ErrSide) {
		t.Errorf("CommSide inside Side: %v, want ErrSide", err)
	}
	must("join", e.Join())
	must("join comm", e.JoinComm())
}

// sideVec is n seeded draws from U(−1, 1).
func sideVec(n int) []float32 {
	r := rand.New(rand.NewPCG(13, 1))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(2*r.Float64() - 1)
	}
	return v
}
