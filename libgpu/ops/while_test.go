package ops_test

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
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
	// gemm halves x with a GEMM (x viewed as [n/8, 8] times 0.5·I, exact
	// in f32) into tmp and a device copy back, instead of Scale: cuBLASLt
	// and a memcpy node inside a conditional body.
	gemm   bool
	w, tmp *tensor.Tensor
}

func newHalving(t testing.TB, e *ops.Engine, a device.Allocator, n, maxIter int) *halving {
	i32 := func() *tensor.Tensor { return opstest.Empty(t, a, tensor.I32, 1) }
	return &halving{e: e, x: opstest.Empty(t, a, tensor.F32, n), y: opstest.Empty(t, a, tensor.F32, n),
		flag: i32(), count: i32(), oflag: i32(), ocount: i32(),
		o: opstest.Empty(t, a, tensor.F32, 1), minus1: opstest.Upload(t, a, []float32{-1}, 1), maxIter: maxIter}
}

func (h *halving) body() error {
	if h.gemm {
		x, err := h.x.View(h.x.Numel()/8, 8)
		if err != nil {
			return err
		}
		if err := h.e.Linear(h.tmp, x, h.w, nil, nil, ops.ActNone); err != nil {
			return err
		}
		if err := h.e.Copy(h.x, h.tmp); err != nil {
			return err
		}
	} else if err := h.e.Scale(h.x, h.x, 0.5, false); err != nil {
		return err
	}
	return h.e.CountAbove(h.flag, h.x, 1)
}

// withGEMM switches the body to the GEMM form.
func (h *halving) withGEMM(t testing.TB, a device.Allocator) {
	w := make([]float32, 64)
	for i := 0; i < 8; i++ {
		w[i*8+i] = 0.5
	}
	h.gemm, h.w, h.tmp = true, opstest.Upload(t, a, w, 8, 8), opstest.Empty(t, a, tensor.F32, h.x.Numel()/8, 8)
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
// same with an iteration limit, and with a GEMM and a device copy in the
// body; and nested loops. e must compute f32 GEMMs in f32 (the GEMM body
// halves exactly). The graphs are
// Engine.Capture's: CUDA graphs with conditional nodes on a GPU, the
// function itself on the host.
func runWhile(t *testing.T, e *ops.Engine, a device.Allocator) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 5))
	for _, c := range []struct {
		maxIter int
		gemm    bool
	}{{0, false}, {4, false}, {0, true}} {
		maxIter := c.maxIter
		h := newHalving(t, e, a, 1000, maxIter)
		if c.gemm {
			h.withGEMM(t, a)
		}
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
		{"limit without count", e.While(flag, nil, 3, body), exec.ErrConfig},
		{"negative limit", e.While(flag, opstest.Empty(t, a, tensor.I32, 1), -1, body), exec.ErrConfig},
		{"no body", e.While(flag, nil, 0, nil), exec.ErrConfig},
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

// hrmBlock records, on a bf16 graph without gradients, one post-norm
// block of HRM's shape family (sapientinc/HRM's
// HierarchicalReasoningModel_ACTV1Block): qkv projection, RoPE on q and k,
// non-causal attention, output projection, AddRMSNorm, SwiGLU MLP,
// AddRMSNorm. It returns the graph's input and output.
func hrmBlock(t *testing.T, e *ops.Engine, a device.Allocator, r *rand.Rand, B, T, H, D int) (*ops.Graph, *tensor.Tensor, *ops.Var) {
	C := H * D
	I := ops.SwiGLUInter(C, 4)
	g := ops.NewGraph(e, a, "hrm", ops.GraphOptions{Autocast: tensor.BF16})
	t.Cleanup(func() { g.Free() })
	param := func(name string, rows, cols int) *ops.Var {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(r.NormFloat64() / math.Sqrt(float64(cols)))
		}
		return g.Param(name, opstest.Upload(t, a, v, rows, cols), opstest.Empty(t, a, tensor.F32, rows, cols))
	}
	cs, sn, err := ops.RoPETable(T, D, 10000)
	if err != nil {
		t.Fatal(err)
	}
	cos, sin := opstest.Upload(t, a, cs, T, D), opstest.Upload(t, a, sn, T, D)
	x := opstest.Empty(t, a, tensor.BF16, B, T, C)
	xv := g.Input("x", x)
	qkv := g.Linear(xv, param("qkv", 3*C, C), nil, ops.ActNone)
	qkv = g.View(g.RoPE(g.View(qkv, B, T, 3*H, D), cos, sin, 2*H), B, T, 3*C)
	att := g.Linear(g.SelfAttention(qkv, H, false, 0), param("o", C, C), nil, ops.ActNone)
	h := g.AddRMSNorm(xv, att, nil, 1e-5)
	mlp := g.Linear(g.SwiGLU(g.Linear(h, param("gate_up", 2*I, C), nil, ops.ActNone)), param("down", C, I), nil, ops.ActNone)
	z := g.AddRMSNorm(h, mlp, nil, 1e-5)
	if err := g.Build(false); err != nil {
		t.Fatal(err)
	}
	return g, x, z
}

// runWhileHRMBlock: HRM's halting mechanism on the GPU at HRM's
// sequence shape (82 positions, head dimension 64, bf16): a loop whose body
// runs one block forward on the carried state (z → x) and counts down
// per-sequence steps (the flag: sequences with steps left), captured as a
// conditional WHILE node and replayed on new data, gives bitwise the state
// and trip count of the same loop run eagerly (the host loop) on the same
// data.
func runWhileHRMBlock(t *testing.T, e *ops.Engine, a device.Allocator) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 23))
	const B, T, H, D = 3, 82, 2, 64
	g, x, z := hrmBlock(t, e, a, r, B, T, H, D)
	steps := opstest.Empty(t, a, tensor.F32, B)
	minus := opstest.Upload(t, a, []float32{-1, -1, -1}, B)
	flag, count := opstest.Empty(t, a, tensor.I32, 1), opstest.Empty(t, a, tensor.I32, 1)
	step := func() error {
		if err := e.CountAbove(flag, steps, 0.5); err != nil {
			return err
		}
		return e.While(flag, count, 16, func() error {
			if err := g.Forward(); err != nil {
				return err
			}
			if err := e.Copy(x, z.Value); err != nil {
				return err
			}
			if err := e.Scale(steps, minus, 1, true); err != nil {
				return err
			}
			return e.CountAbove(flag, steps, 0.5)
		})
	}
	load := func(x0 []float32, s0 []float32) {
		if err := x.WriteFloat32(x0); err != nil {
			t.Fatal(err)
		}
		if err := steps.WriteF32(s0); err != nil {
			t.Fatal(err)
		}
	}
	draw := func(maxSteps int) ([]float32, []float32) {
		x0 := make([]float32, B*T*H*D)
		for i := range x0 {
			x0[i] = float32(r.NormFloat64())
		}
		s0 := make([]float32, B)
		for i := range s0 {
			s0[i] = float32(1 + r.IntN(maxSteps))
		}
		return x0, s0
	}
	run := func(launch func() error) ([]byte, int32, []float32) {
		if err := launch(); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		b, err := x.Read()
		if err != nil {
			t.Fatal(err)
		}
		v, err := x.ReadFloat32()
		if err != nil {
			t.Fatal(err)
		}
		for i, f := range v {
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				t.Fatalf("state element %d is %v", i, f)
			}
		}
		return b, opstest.DownloadI32(t, count)[0], v
	}
	x0, s0 := draw(6)
	load(x0, s0)
	run(step) // eagerly once: kernels, scratch and body streams exist before the capture
	graph, err := e.Capture(step)
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	for _, maxSteps := range []int{6, 1, 12, 3} {
		x0, s0 := draw(maxSteps)
		load(x0, s0)
		want, wantN, wv := run(step)
		load(x0, s0)
		got, gotN, _ := run(graph.Launch)
		var moved float64
		for i := range wv {
			moved = max(moved, math.Abs(float64(wv[i]-x0[i])))
		}
		if moved < 0.1 {
			t.Fatalf("the loop left the state (nearly) unchanged: largest change %v", moved)
		}
		if gotN != wantN || !bytes.Equal(got, want) {
			t.Fatalf("steps %v: graph ran %d iterations, eager %d; states equal: %v", s0, gotN, wantN, bytes.Equal(got, want))
		}
		if wantN != int32(max(s0[0], s0[1], s0[2])) {
			t.Fatalf("steps %v: %d iterations", s0, wantN)
		}
		t.Logf("steps %v: %d iterations, graph = eager bitwise", s0, gotN)
	}
}

// TestWhileHRMBlockHost runs runWhileHRMBlock on the host backend.
func TestWhileHRMBlockHost(t *testing.T) {
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runWhileHRMBlock(t, e, device.Local{Dev: h})
}
