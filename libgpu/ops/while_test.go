package ops_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// halving is a loop whose trip count depends on the data: its body halves
// every element of x (exact in f32) and sets the flag to the number of
// elements still above 1, so it runs ⌈log₂ max x⌉ times (none when every
// element is ≤ 1). Around it, the step computes the flag from x first and
// y = 3x after, so a graph also checks what comes before and after the
// loop. nested wraps it in an outer loop of o rounds that multiplies x by
// 8 after each inner loop (three more halvings per round).
type halving struct {
	e                        *ops.Engine
	x, y, flag, count        *tensor.Tensor
	o, oflag, ocount, minus1 *tensor.Tensor
	maxIter                  int
}

func newHalving(t testing.TB, e *ops.Engine, a device.Allocator, n, maxIter int) *halving {
	i32 := func() *tensor.Tensor { return opstest.Empty(t, a, tensor.I32, 1) }
	return &halving{e: e, x: opstest.Empty(t, a, tensor.F32, n), y: opstest.Empty(t, a, tensor.F32, n),
		flag: i32(), count: i32(), oflag: i32(), ocount: i32(),
		o: opstest.Empty(t, a, tensor.F32, 1), minus1: opstest.Upload(t, a, []float32{-1}, 1), maxIter: maxIter}
}

func (h *halving) body() error {
	if err := h.e.Scale(h.x, h.x, 0.5, false); err != nil {
		return err
	}
	return h.e.CountAbove(h.flag, h.x, 1)
}

func (h *halving) inner() error {
	if err := h.e.CountAbove(h.flag, h.x, 1); err != nil {
		return err
	}
	return h.e.While(h.flag, h.count, h.maxIter, h.body)
}

// step is the flat loop and the work after it.
func (h *halving) step() error {
	if err := h.inner(); err != nil {
		return err
	}
	return h.e.Scale(h.y, h.x, 3, false)
}

// nested is the outer loop: while o > 0.5 { inner loop; x ← 8x; o ← o − 1 }.
func (h *halving) nested() error {
	if err := h.e.CountAbove(h.oflag, h.o, 0.5); err != nil {
		return err
	}
	if err := h.e.While(h.oflag, h.ocount, 0, func() error {
		if err := h.inner(); err != nil {
			return err
		}
		if err := h.e.Scale(h.x, h.x, 8, false); err != nil {
			return err
		}
		if err := h.e.Scale(h.o, h.minus1, 1, true); err != nil {
			return err
		}
		return h.e.CountAbove(h.oflag, h.o, 0.5)
	}); err != nil {
		return err
	}
	return h.e.Scale(h.y, h.x, 3, false)
}

// simulate is the loop in plain Go: the final x, the inner loop's last
// trip count (−1: no inner loop ran) and the outer loop's (rounds < 0: the
// flat loop).
func simulate(x0 []float32, maxIter, rounds int) (x []float32, inner, outer int) {
	x = append([]float32(nil), x0...)
	above := func() bool {
		for _, v := range x {
			if v > 1 {
				return true
			}
		}
		return false
	}
	loop := func() int {
		n := 0
		for above() && (maxIter == 0 || n < maxIter) {
			for i := range x {
				x[i] *= 0.5
			}
			n++
		}
		return n
	}
	if rounds < 0 {
		return x, loop(), 0
	}
	inner = -1
	for outer = 0; outer < rounds; outer++ {
		inner = loop()
		for i := range x {
			x[i] *= 8
		}
	}
	return x, inner, outer
}

// load writes a fresh x with largest element 2^k·u, u in (0.5, 1] (k ≤ 0:
// every element ≤ 1) and o = rounds (< 0: the flat loop; o unused).
func (h *halving) load(t testing.TB, r *rand.Rand, k, rounds int) []float32 {
	t.Helper()
	x := make([]float32, h.x.Numel())
	for i := range x {
		x[i] = float32(r.Float64() * math.Ldexp(1, k))
	}
	x[r.IntN(len(x))] = float32(math.Ldexp(0.5+0.5*r.Float64(), k))
	for _, w := range []struct {
		t *tensor.Tensor
		v []float32
	}{{h.x, x}, {h.o, []float32{float32(max(rounds, 0))}}} {
		if err := w.t.WriteF32(w.v); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*tensor.Tensor{h.y, h.count, h.ocount} {
		if err := opstest.Poison(p); err != nil {
			t.Fatal(err)
		}
	}
	return x
}

// check compares x, y and the trip counts with simulate.
func (h *halving) check(t testing.TB, what string, x0 []float32, rounds int) {
	t.Helper()
	wx, inner, outer := simulate(x0, h.maxIter, rounds)
	gx, gy := opstest.Download(t, h.x), opstest.Download(t, h.y)
	for i := range wx {
		if gx[i] != float64(wx[i]) || gy[i] != float64(3*wx[i]) {
			t.Fatalf("%s: x[%d] = %v, y = %v; want %v, %v", what, i, gx[i], gy[i], wx[i], 3*wx[i])
		}
	}
	if got := opstest.DownloadI32(t, h.count)[0]; inner >= 0 && int(got) != inner || inner < 0 && got != opstest.PoisonI32 {
		t.Fatalf("%s: inner trip count %d, want %d", what, got, inner)
	}
	if rounds >= 0 {
		if got := opstest.DownloadI32(t, h.ocount)[0]; int(got) != outer {
			t.Fatalf("%s: outer trip count %d, want %d", what, got, outer)
		}
	}
	t.Logf("%s: %d inner iterations, %d outer", what, inner, outer)
}

// runWhile checks While on e: a loop run eagerly, then captured once and
// replayed on data asking for different trip counts (none included); the
// same with an iteration limit; and nested loops. The graphs are
// Engine.Capture's: CUDA graphs with conditional nodes on a GPU, the
// function itself on the host.
func runWhile(t *testing.T, e *ops.Engine, a device.Allocator) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 5))
	for _, maxIter := range []int{0, 4} {
		h := newHalving(t, e, a, 1000, maxIter)
		x0 := h.load(t, r, 7, -1)
		if err := h.step(); err != nil {
			t.Fatal(err)
		}
		h.check(t, "eager", x0, -1)
		g, err := e.Capture(h.step)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []int{5, 0, 11, 1, 3} {
			x0 := h.load(t, r, k, -1)
			if err := g.Launch(); err != nil {
				t.Fatal(err)
			}
			h.check(t, "graph", x0, -1)
		}
		g.Close()
	}
	h := newHalving(t, e, a, 300, 0)
	x0 := h.load(t, r, 4, 2)
	if err := h.nested(); err != nil {
		t.Fatal(err)
	}
	h.check(t, "nested eager", x0, 2)
	g, err := e.Capture(h.nested)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, c := range [][2]int{{6, 3}, {2, 1}, {9, 0}, {0, 2}} {
		x0 := h.load(t, r, c[0], c[1])
		if err := g.Launch(); err != nil {
			t.Fatal(err)
		}
		h.check(t, "nested graph", x0, c[1])
	}
}

// TestWhileHost runs the While checks on the host backend (the host loop
// is what the GPU's conditional nodes are checked against).
func TestWhileHost(t *testing.T) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runWhile(t, e, device.Local{Dev: h})
}

func TestWhileValidation(t *testing.T) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := device.Local{Dev: h}
	flag := opstest.UploadI32(t, a, []int32{1}, 1)
	body := func() error { return nil }
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"f32 cond", e.While(opstest.Empty(t, a, tensor.F32, 1), nil, 0, body), tensor.ErrDType},
		{"cond of two", e.While(opstest.Empty(t, a, tensor.I32, 2), nil, 0, body), tensor.ErrShape},
		{"no cond", e.While(nil, nil, 0, body), tensor.ErrShape},
		{"limit without count", e.While(flag, nil, 3, body), ops.ErrConfig},
		{"negative limit", e.While(flag, opstest.Empty(t, a, tensor.I32, 1), -1, body), ops.ErrConfig},
		{"no body", e.While(flag, nil, 0, nil), ops.ErrConfig},
		{"f32 count", e.While(flag, opstest.Empty(t, a, tensor.F32, 1), 2, body), tensor.ErrDType},
		{"count above of bf16", e.CountAbove(flag, opstest.Empty(t, a, tensor.BF16, 3), 0), tensor.ErrDType},
		{"count above into two", e.CountAbove(opstest.Empty(t, a, tensor.I32, 2), opstest.Empty(t, a, tensor.F32, 3), 0), tensor.ErrShape},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	// A body's error stops the loop and is returned.
	boom := errors.New("boom")
	n := 0
	if err := e.While(flag, nil, 0, func() error { n++; return boom }); !errors.Is(err, boom) || n != 1 {
		t.Errorf("body error: %v after %d runs", err, n)
	}
}
