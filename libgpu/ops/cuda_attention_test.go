package ops_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// attnLarge is one GPU attention configuration: q, k, v are the parts of a
// fused qkv [B,T,3,H,D], as Graph.SelfAttention gives them.
type attnLarge struct {
	b, h, t, d int
	causal     bool
	dt         tensor.DType
}

func (c attnLarge) String() string {
	return fmt.Sprintf("%v/B%d,H%d,T%d,D%d/causal=%v", c.dt, c.b, c.h, c.t, c.d, c.causal)
}

// attnTensors holds one configuration's device tensors.
type attnTensors struct {
	qkv, dqkv, o, do, lse *tensor.Tensor
	q, k, v, dq, dk, dv   *tensor.Tensor
	drop                  ops.AttnDropout // dropout on P (zero: none)
}

// newAttnTensors uploads fresh random qkv and do (unit variance) and
// allocates poisoned o, lse and dqkv.
func newAttnTensors(tb testing.TB, a device.Allocator, r *rand.Rand, c attnLarge) *attnTensors {
	tb.Helper()
	sqrt3 := float32(math.Sqrt(3))
	upload := func(shape ...int) *tensor.Tensor {
		x := opstest.Empty(tb, a, c.dt, shape...)
		v := opstest.Rand(r, x.Numel())
		for i := range v {
			v[i] *= sqrt3 // U(−√3, √3): variance 1
		}
		if err := x.WriteFloat32(v); err != nil {
			tb.Fatal(err)
		}
		return x
	}
	at := &attnTensors{
		qkv:  upload(c.b, c.t, 3, c.h, c.d),
		do:   upload(c.b, c.t, c.h, c.d),
		dqkv: opstest.Empty(tb, a, c.dt, c.b, c.t, 3, c.h, c.d),
		o:    opstest.Empty(tb, a, c.dt, c.b, c.t, c.h, c.d),
		lse:  opstest.Empty(tb, a, tensor.F32, c.b, c.h, c.t),
	}
	parts := func(x *tensor.Tensor) (p [3]*tensor.Tensor) {
		for i := range p {
			var err error
			if p[i], err = x.Select(2, i); err != nil {
				tb.Fatal(err)
			}
		}
		return p
	}
	p, g := parts(at.qkv), parts(at.dqkv)
	at.q, at.k, at.v = p[0], p[1], p[2]
	at.dq, at.dk, at.dv = g[0], g[1], g[2]
	return at
}

func (at *attnTensors) forward(e *ops.Engine, c attnLarge) error {
	return e.AttentionForward(at.o, at.lse, at.q, at.k, at.v, c.causal, float32(1/math.Sqrt(float64(c.d))), at.drop)
}

func (at *attnTensors) backward(e *ops.Engine, c attnLarge) error {
	return e.AttentionBackward(at.dq, at.dk, at.dv, at.do, at.q, at.k, at.v, at.o, at.lse, c.causal,
		float32(1/math.Sqrt(float64(c.d))), [3]bool{}, at.drop)
}

// outputs are the raw bytes of everything the forward and backward write.
func (at *attnTensors) outputs(t *testing.T, e *ops.Engine) [][]byte {
	t.Helper()
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, x := range []*tensor.Tensor{at.o, at.lse, at.dqkv} {
		b, err := x.Read()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func (at *attnTensors) poison(t *testing.T, e *ops.Engine) {
	t.Helper()
	if err := e.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*tensor.Tensor{at.o, at.lse, at.dqkv} {
		if err := opstest.Poison(x); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCUDAAttentionLarge: fresh random inputs at the benchmark shapes
// (nanoGPT's 64×6×256×64 and 8×16×2048×128, causal bf16 on tensor cores),
// at T not a multiple of the 64-row tile, non-causal, f32 and a head
// dimension the tensor cores do not take. Outputs are poisoned first:
// every element of o, lse, dq, dk, dv must be written (no NaN), and a
// sample of (b, h) pairs must match the float64 naive attention and its
// gradients. Then the forward and backward captured as a CUDA graph and
// replayed must give bitwise what the eager run gave (determinism: no
// atomics, fixed summation order).
func TestCUDAAttentionLarge(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(rand.Uint64(), 21))
	for _, c := range []attnLarge{
		{64, 6, 256, 64, true, tensor.BF16},
		{8, 16, 2048, 128, true, tensor.BF16},
		{4, 6, 1000, 64, true, tensor.BF16},
		{2, 4, 777, 128, false, tensor.BF16},
		{1, 2, 1, 64, true, tensor.BF16},
		{3, 6, 300, 64, true, tensor.F32},
		{2, 3, 129, 80, true, tensor.BF16},
	} {
		t.Run(c.String(), func(t *testing.T) {
			cudatest.RequireGPU(t)
			attnLargeCheck(t, e, a, r, c)
		})
	}
}

func attnLargeCheck(t *testing.T, e *ops.Engine, a device.Allocator, r *rand.Rand, c attnLarge) {
	attnLargeCheckDrop(t, e, a, r, c, ops.AttnDropout{}, 0)
}

// attnLargeCheckDrop is attnLargeCheck with dropout drop on P, whose
// counter holds step.
// At head dimension 256 (a forward only) the backward is not run and dqkv
// not checked.
func attnLargeCheckDrop(t *testing.T, e *ops.Engine, a device.Allocator, r *rand.Rand, c attnLarge, drop ops.AttnDropout, step uint32) {
	at := newAttnTensors(t, a, r, c)
	at.drop = drop
	full := opstest.RefAttnKeep(drop, step, opstest.AttnShape{B: c.b, Tq: c.t, Tk: c.t, H: c.h, D: c.d})
	bwd := c.d <= 128
	run := func() error {
		if err := at.forward(e, c); err != nil || !bwd {
			return err
		}
		return at.backward(e, c)
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
	eager := at.outputs(t, e)

	read := func(x *tensor.Tensor) []float32 {
		v, err := x.ReadFloat32()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	qkv, do, o, lse, dqkv := read(at.qkv), read(at.do), read(at.o), read(at.lse), read(at.dqkv)
	outs := map[string][]float32{"o": o, "lse": lse, "dqkv": dqkv}
	if !bwd {
		delete(outs, "dqkv")
	}
	for name, v := range outs {
		for i, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("%s[%d] = %v: not written, or not finite", name, i, x)
			}
		}
	}

	// Sampled (b, h) against the float64 reference.
	tolO, tolG := 1e-2, 2e-2
	if c.dt == tensor.F32 {
		tolO, tolG = 1e-5, 5e-5
	}
	one := opstest.AttnShape{B: 1, Tq: c.t, Tk: c.t, H: 1, D: c.d}
	scale := 1 / math.Sqrt(float64(c.d))
	pairs := [][2]int{{0, 0}, {c.b - 1, c.h - 1}, {r.IntN(c.b), r.IntN(c.h)}}
	if c.t > 1000 {
		pairs = pairs[:2] // the float64 reference takes seconds per pair
	}
	for _, p := range pairs {
		b, h := p[0], p[1]
		// slice takes [b, :, part, h, :] of a [B,T,parts,H,D] row-major array.
		slice := func(v []float32, parts, part int) []float64 {
			out := make([]float64, 0, c.t*c.d)
			for i := 0; i < c.t; i++ {
				off := (((b*c.t+i)*parts+part)*c.h + h) * c.d
				out = append(out, opstest.F64(v[off:off+c.d])...)
			}
			return out
		}
		q, k, v := slice(qkv, 3, 0), slice(qkv, 3, 1), slice(qkv, 3, 2)
		var keep opstest.AttnKeep
		if full != nil {
			keep = func(_, _, i, j int) bool { return full(b, h, i, j) }
		}
		wo, wl := opstest.RefAttentionDrop(q, k, v, one, c.causal, scale, keep, drop.P)
		// bf16: δ from the stored output, as the kernel takes it (see
		// RefAttentionBackwardDropO: at T = 1 the gradients of q and k
		// are that rounding alone).
		var ostored []float64
		if c.dt == tensor.BF16 {
			ostored = slice(o, 1, 0)
		}
		what := fmt.Sprintf("(b,h)=(%d,%d)", b, h)
		attnNear(t, what+" o", slice(o, 1, 0), wo, tolO, c.d)
		attnNear(t, what+" lse", opstest.F64(lse[(b*c.h+h)*c.t:(b*c.h+h+1)*c.t]), wl, 1e-5, 1)
		if !bwd {
			continue
		}
		wq, wk, wv := opstest.RefAttentionBackwardDropO(slice(do, 1, 0), ostored, q, k, v, one, c.causal, scale, keep, drop.P)
		attnNear(t, what+" dq", slice(dqkv, 3, 0), wq, tolG, c.d)
		attnNear(t, what+" dk", slice(dqkv, 3, 1), wk, tolG, c.d)
		attnNear(t, what+" dv", slice(dqkv, 3, 2), wv, tolG, c.d)
	}

	// A second eager run, then a captured graph replayed: bitwise equal.
	at.poison(t, e)
	if err := run(); err != nil {
		t.Fatal(err)
	}
	for i, b := range at.outputs(t, e) {
		if !bytes.Equal(b, eager[i]) {
			t.Errorf("eager run 2: %s differs from run 1", []string{"o", "lse", "dqkv"}[i])
		}
	}
	at.poison(t, e)
	g, err := e.Capture(run)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Launch(); err != nil {
		t.Fatal(err)
	}
	for i, b := range at.outputs(t, e) {
		if !bytes.Equal(b, eager[i]) {
			t.Errorf("graph replay: %s differs from the eager run", []string{"o", "lse", "dqkv"}[i])
		}
	}
}

// attnNear is near for a [T, d] matrix; on failure it also logs the
// relative error of each block of 64 rows × 64 columns (and the first bad
// element), which tells a wrong tile layout (one column half, one key
// block) from wrong arithmetic (everything).
func attnNear(t *testing.T, what string, got, want []float64, tol float64, d int) {
	t.Helper()
	if err := opstest.TermsErr(got, want, nil); err <= tol {
		return
	}
	near(t, what, got, want, tol)
	rows := len(want) / d
	var b strings.Builder
	skipped := false
	for r0 := 0; r0 < rows; r0 += 64 {
		if r0 >= 64*8 && r0 < rows-64*2 {
			if !skipped {
				fmt.Fprintf(&b, "\n  ...")
			}
			skipped = true
			continue
		}
		fmt.Fprintf(&b, "\n  rows %4d..:", r0)
		for c0 := 0; c0 < d; c0 += 64 {
			var g, w []float64
			for r := r0; r < min(r0+64, rows); r++ {
				g = append(g, got[r*d+c0:r*d+min(c0+64, d)]...)
				w = append(w, want[r*d+c0:r*d+min(c0+64, d)]...)
			}
			fmt.Fprintf(&b, " cols %d..: %.2g", c0, opstest.TermsErr(g, w, nil))
		}
	}
	for i := range got {
		if e := math.Abs(got[i] - want[i]); !(e <= 10*tol*(1+math.Abs(want[i]))) {
			fmt.Fprintf(&b, "\n  first bad element [%d, %d]: %v, want %v", i/d, i%d, got[i], want[i])
			break
		}
	}
	t.Logf("%s by blocks:%s", what, b.String())
}

// The benchmark shapes of issue 10: nanoGPT's shakespeare-char attention
// (B 64, H 6, T 256, D 64) and a long one (B 8, H 16, T 2048, D 128),
// causal bf16. PyTorch SDPA on an H100: 0.033 / 0.185 ms and 0.263 / 1.40
// ms (forward / forward+backward). And the 12-layer GPT's (B 32, H 12, T
// 1024, D 64), where PyTorch DDP with torch.compile outran the trainer at
// 1 and 2 GPUs (issue 27).
var attnBenchShapes = []attnLarge{
	{64, 6, 256, 64, true, tensor.BF16},
	{8, 16, 2048, 128, true, tensor.BF16},
	{32, 12, 1024, 64, true, tensor.BF16}, // the 12-layer GPT's at batch 32 (bench/scale.sh's strong runs)
	// issue 25's table: the rest of its shapes, causal and not
	{8, 32, 2048, 64, true, tensor.BF16},
	{2, 16, 8192, 128, true, tensor.BF16},
	{64, 6, 256, 64, false, tensor.BF16},
	{8, 16, 2048, 128, false, tensor.BF16},
	{8, 32, 2048, 64, false, tensor.BF16},
	{2, 16, 8192, 128, false, tensor.BF16},
}

// attnFlops is the forward's FLOP count of the two products (4·B·H·T²·D,
// halved by the causal mask; FlashAttention's convention): the backward is
// counted as 2.5× that (five products), whatever the kernels recompute.
func attnFlops(c attnLarge) float64 {
	f := 4 * float64(c.b*c.h) * float64(c.t) * float64(c.t) * float64(c.d)
	if c.causal {
		f /= 2
	}
	return f
}

// attnPath is a choice of kernels (ops.SetAttentionWGMMA's mode; -1:
// the default) and of the blocks' launch order (ops.SetAttentionL2Budget's
// bytes; -1: the default).
type attnPath struct {
	name string
	mode int
	l2   int
	drop float32 // dropout probability on P (0: none)
	bwd  int     // the backward's attnBwdWSMode (-1: the default)
}

// set applies p's kernel choices (each one that is not negative; bwd > 0
// lets dropout take the warp-specialised backward too) and returns a func
// that restores them.
func (p attnPath) set() (restore func()) {
	var rs []func()
	if p.mode >= 0 {
		rs = append(rs, ops.SetAttentionWGMMA(p.mode))
	}
	if p.bwd >= 0 {
		rs = append(rs, ops.SetAttentionBwdWS(p.bwd), ops.SetAttentionBwdWSDrop(p.bwd > 0))
	}
	if p.l2 >= 0 {
		rs = append(rs, ops.SetAttentionL2Budget(p.l2))
	}
	return func() {
		for i := len(rs) - 1; i >= 0; i-- {
			rs[i]()
		}
	}
}

// benchAttention times pass (forward, backward or both) the way
// bench/reference/gpt.py times SDPA: each call between two CUDA events,
// waited for before the next, and the median over b.N calls, reported as
// ms/call and TFLOP/s (attnFlops). With paths, each shape is timed once
// per path (sub-benchmark path/shape); without, on the default path.
func benchAttention(b *testing.B, pass string, paths ...attnPath) {
	cudatest.RequireGPU(b)
	d, err := device.NewCUDA(0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() }) // cleanups run last-in first-out: buffers first
	e, err := ops.NewEngine(d, ops.Options{Precision: ops.PrecTF32})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	ev0, err := e.NewEvent(true)
	if err != nil {
		b.Fatal(err)
	}
	ev1, err := e.NewEvent(true)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ev0.Close(); ev1.Close() })
	if len(paths) == 0 {
		paths = []attnPath{{"", -1, -1, 0, -1}}
	} else if !ops.AttentionHopper(e) {
		b.Log("not sm_90a (or attention.cu lacks its wgmma code): the wgmma paths run mma.sync")
	}
	r := rand.New(rand.NewPCG(1, 2))
	ctr := opstest.UploadI32(b, device.Local{Dev: d}, []int32{1}, 1) // the dropout step counter
	for _, c := range attnBenchShapes {
		at := newAttnTensors(b, device.Local{Dev: d}, r, c)
		scale := float32(1 / math.Sqrt(float64(c.d)))
		step := func() error {
			switch pass {
			case "forward":
				return at.forward(e, c)
			case "backward":
				return at.backward(e, c)
			case "forward+backward":
				return errors.Join(at.forward(e, c), at.backward(e, c))
			case "backward dK,dV":
				return e.AttentionBackward(nil, at.dk, at.dv, at.do, at.q, at.k, at.v, at.o, at.lse, c.causal, scale, [3]bool{}, ops.AttnDropout{})
			case "backward dQ":
				return e.AttentionBackward(at.dq, nil, nil, at.do, at.q, at.k, at.v, at.o, at.lse, c.causal, scale, [3]bool{}, ops.AttnDropout{})
			}
			return fmt.Errorf("pass %q", pass)
		}
		// The backward's passes are counted as their products: dK,dV 4 and
		// dQ 3 of the 2-FLOP-per-MAC T²/2·D products (δ included in the time).
		flops := map[string]float64{"forward": 1, "backward": 2.5, "forward+backward": 3.5,
			"backward dK,dV": 2, "backward dQ": 1.5}[pass] * attnFlops(c)
		for _, p := range paths {
			name := fmt.Sprintf("B%d,H%d,T%d,D%d", c.b, c.h, c.t, c.d)
			if !c.causal {
				name += ",noncausal"
			}
			if p.name != "" {
				name = p.name + "/" + name
			}
			restore := p.set()
			at.drop = ops.AttnDropout{}
			if p.drop > 0 {
				at.drop = ops.AttnDropout{P: p.drop, Seed: 0x9e3779b97f4a7c15, Counter: ctr}
			}
			b.Run(name, func(b *testing.B) {
				// Inside the sub-benchmark, so that -test.bench's filter
				// (and a profiler's launch count) sees only its launches.
				if err := at.forward(e, c); err != nil { // compiles, and gives backward its inputs
					b.Fatal(err)
				}
				for i := 0; i < 3; i++ { // warm-up
					if err := step(); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.Sync(); err != nil {
					b.Fatal(err)
				}
				ms := make([]float64, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					err := errors.Join(ev0.Record(), step(), ev1.Record(), ev1.Wait())
					t, terr := ev1.Elapsed(ev0)
					if err := errors.Join(err, terr); err != nil {
						b.Fatal(err)
					}
					ms = append(ms, float64(t))
				}
				b.StopTimer()
				slices.Sort(ms)
				med := ms[len(ms)/2]
				b.ReportMetric(med, "ms/call")
				b.ReportMetric(flops/(med*1e-3)/1e12, "TFLOP/s")
			})
			restore()
		}
	}
}

// BenchmarkAttentionForward: causal bf16 forward (tensor cores).
func BenchmarkAttentionForward(b *testing.B) { benchAttention(b, "forward") }

// BenchmarkAttentionForwardWide: the forward at head dimension 256
// (attn_fwd_ws_d256), causal and not.
func BenchmarkAttentionForwardWide(b *testing.B) {
	old := attnBenchShapes
	attnBenchShapes = []attnLarge{{4, 16, 2048, 256, true, tensor.BF16}, {4, 16, 2048, 256, false, tensor.BF16}}
	defer func() { attnBenchShapes = old }()
	benchAttention(b, "forward")
}

// BenchmarkAttentionBackward: the backward alone (δ, dK/dV pass, dQ pass).
func BenchmarkAttentionBackward(b *testing.B) { benchAttention(b, "backward") }

// BenchmarkAttentionForwardBackward: forward then backward, what SDPA's
// forward+backward figures measure.
func BenchmarkAttentionForwardBackward(b *testing.B) { benchAttention(b, "forward+backward") }

// attnPaths are the kernel families: mma.sync (sm_80 and later) and wgmma
// (sm_90a) for D = 128 and D = 64.
var attnPaths = []attnPath{{"mma.sync", 0, -1, 0, 0}, {"wgmma", 2, -1, 0, 0}}

// BenchmarkAttentionForwardPaths: the forward on each kernel family at
// both shapes, and on the warp-specialised wgmma forward (mode 3), its
// persistent form (mode 4), and both with three consumer warpgroups at
// D = 64 (modes 5 and 6; D = 128 runs mode 3's kernel there).
func BenchmarkAttentionForwardPaths(b *testing.B) {
	benchAttention(b, "forward", append(attnPaths[:len(attnPaths):len(attnPaths)], attnPath{"ws", 3, -1, 0, -1}, attnPath{"ws-persistent", 4, -1, 0, -1},
		attnPath{"ws-c3", 5, -1, 0, -1}, attnPath{"ws-c3-persistent", 6, -1, 0, -1})...)
}

// BenchmarkAttentionForwardDropout: the forward with dropout on P
// (p = 0.1) on its default kernel, the wgmma kernel (mode 2) and the
// warp-specialised one (mode 3).
func BenchmarkAttentionForwardDropout(b *testing.B) {
	benchAttention(b, "forward", attnPath{"default", -1, -1, 0.1, -1}, attnPath{"wgmma", 2, -1, 0.1, 0}, attnPath{"ws", 3, -1, 0.1, -1})
}

// BenchmarkAttentionForwardBackwardDropout: forward then backward with
// dropout on P (p = 0.1) on the default kernels, the keep mask drawn in
// the forward and again in both backward passes; and with the
// warp-specialised backward's dropping kernels as the default mix would
// take them (bwd-ws: attnBwdWSMode 1 with SetAttentionBwdWSDrop).
func BenchmarkAttentionForwardBackwardDropout(b *testing.B) {
	benchAttention(b, "forward+backward", attnPath{"default", -1, -1, 0.1, -1}, attnPath{"bwd-ws", -1, -1, 0.1, 1})
}

// BenchmarkAttentionBackwardPaths: the backward on each kernel family.
func BenchmarkAttentionBackwardPaths(b *testing.B) { benchAttention(b, "backward", attnPaths...) }

// BenchmarkAttentionForwardBackwardPaths: forward+backward on each family.
func BenchmarkAttentionForwardBackwardPaths(b *testing.B) {
	benchAttention(b, "forward+backward", attnPaths...)
}

// BenchmarkAttentionL2Order: forward+backward on the default kernels with
// the blocks launched in groups of heads whose operands fit in L2 (the
// default) and without (every head's row blocks apart: the order before).
func BenchmarkAttentionL2Order(b *testing.B) {
	benchAttention(b, "forward+backward", attnPath{"l2-groups", -1, -1, 0, -1}, attnPath{"no-groups", -1, 0, 0, -1})
}

// BenchmarkAttentionBackwardDKDV: δ and the dK/dV pass alone (no dq asked
// for), per kernel family; TFLOP/s counts the pass's 4 products.
func BenchmarkAttentionBackwardDKDV(b *testing.B) { benchAttention(b, "backward dK,dV", attnPaths...) }

// BenchmarkAttentionBackwardWS: the backward, and each of its passes
// alone, on the warp-specialised kernels (attn_bwd_dkdv_ws, attn_bwd_dq_ws;
// compare with the wgmma path of BenchmarkAttentionBackwardPaths,
// BenchmarkAttentionBackwardDKDV and BenchmarkAttentionBackwardDQ).
func BenchmarkAttentionBackwardWS(b *testing.B) {
	for _, pass := range []string{"backward", "backward dK,dV", "backward dQ"} {
		b.Run(strings.ReplaceAll(pass, " ", "-"), func(b *testing.B) {
			benchAttention(b, pass, attnPath{"wgmma-ws", 2, -1, 0, 2})
		})
	}
}

// BenchmarkAttentionBackwardDQ: δ and the dQ pass alone (no dk, dv), per
// kernel family; TFLOP/s counts the pass's 3 products.
func BenchmarkAttentionBackwardDQ(b *testing.B) { benchAttention(b, "backward dQ", attnPaths...) }

// TestCUDAAttentionDropout: dropout on P (p = 0.2, a shard's batch offset,
// a step from the counter) on every kernel family against the float64
// reference with the same mask — f32 (CUDA cores), bf16 D = 64 and 128 on
// the default dispatch (mma.sync; wgmma for D = 128 on sm_90a), causal and
// not, T not a multiple of any tile, D = 80 (CUDA cores, bf16) — forward
// and backward; two eager runs and a graph replay bitwise equal
// (attnLargeCheckDrop); and on sm_90a the other tensor-core family too,
// attn_fwd_wg_drop (mode 2), the warp-specialised forward with dropout
// (mode 3; the default's on wgmma) and behind it the warp-specialised
// backward's dropping kernels (bwd-ws).
// Then the step counter moving changes o, and moving back restores it.
func TestCUDAAttentionDropout(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	a := device.Local{Dev: d}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 23))
	const step = 4321
	ctr := opstest.UploadI32(t, a, []int32{step}, 1)
	drop := ops.AttnDropout{P: 0.2, Seed: 0x9e3779b97f4a7c15, Site: 3, Counter: ctr, B0: 7}
	cases := []attnLarge{
		{4, 6, 256, 64, true, tensor.BF16},
		{2, 4, 333, 64, false, tensor.BF16},
		{2, 4, 200, 128, true, tensor.BF16},
		{1, 2, 129, 128, false, tensor.BF16},
		{2, 3, 100, 64, true, tensor.F32},
		{1, 2, 77, 32, false, tensor.F32},
		{2, 3, 129, 80, true, tensor.BF16},
		{1, 2, 1, 64, true, tensor.BF16},
	}
	for _, c := range cases {
		t.Run(c.String(), func(t *testing.T) {
			cudatest.RequireGPU(t)
			attnLargeCheckDrop(t, e, a, r, c, drop, step)
		})
	}
	if ops.AttentionHopper(e) {
		// bwd-ws: the warp-specialised backward's dropping kernels
		// (attn_bwd_*_ws_drop; SetAttentionBwdWSDrop, not yet a default).
		for _, p := range []attnPath{{"mma.sync", 0, -1, 0, 0}, {"wgmma", 2, -1, 0, 0}, {"ws", 3, -1, 0, -1}, {"bwd-ws", 3, -1, 0, 2}} {
			for _, c := range cases[:4] {
				t.Run(p.name+"/"+c.String(), func(t *testing.T) {
					cudatest.RequireGPU(t)
					defer p.set()()
					attnLargeCheckDrop(t, e, a, r, c, drop, step)
				})
			}
		}
	}
	t.Run("counter", func(t *testing.T) {
		cudatest.RequireGPU(t)
		c := attnLarge{2, 4, 200, 64, true, tensor.BF16}
		at := newAttnTensors(t, a, r, c)
		at.drop = drop
		run := func(s int32) []byte {
			if err := ctr.Write(tensor.AsBytes([]int32{s})); err != nil {
				t.Fatal(err)
			}
			if err := at.forward(e, c); err != nil {
				t.Fatal(err)
			}
			if err := at.backward(e, c); err != nil {
				t.Fatal(err)
			}
			out := at.outputs(t, e)
			return slices.Concat(out[0], out[2])
		}
		o1 := run(step)
		if o2 := run(step + 1); bytes.Equal(o1, o2) {
			t.Error("the next step drew the same masks")
		}
		if o3 := run(step); !bytes.Equal(o1, o3) {
			t.Error("the same step twice: outputs differ")
		}
	})
}

// TestCUDAAttentionPaths checks the kernel families the default dispatch
// does not take on this GPU against the reference, like
// TestCUDAAttentionLarge: on sm_90a the mma.sync forward at D = 128 and
// attn_fwd_wg (mode 2; the default's forward takes attn_fwd_ws) at D = 64
// and 128, attn_fwd_ws (mode 3) at D = 64 below attnWG64MinT, where the
// default takes mma.sync, the persistent attn_fwd_ws at both head
// dimensions (mode 4; the default's at D = 64) with more tiles than
// blocks, its three-consumer forms at D = 64 (modes 5 and 6; the
// default's from T = 2048), and the warp-specialised backward (both
// passes; the default's dQ pass, and dK/dV at D = 64), and the D = 256
// forward. On an sm_90a device the
// wgmma kernels must be there: a module compiled without them (the sm_90a
// guard off) fails.
func TestCUDAAttentionPaths(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecTF32)
	a := device.Local{Dev: d}
	if major, minor := d.ComputeCapability(); major == 9 && minor == 0 && !ops.AttentionHopper(e) {
		t.Fatal("sm_90a device, but attention.cu was compiled without its wgmma kernels")
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), 22))
	for _, p := range []struct {
		path  attnPath
		cases []attnLarge
	}{
		{attnPath{"mma.sync", 0, -1, 0, 0}, []attnLarge{
			{8, 16, 2048, 128, true, tensor.BF16},
			{2, 4, 777, 128, false, tensor.BF16},
			{1, 2, 1, 128, true, tensor.BF16},
		}},
		{attnPath{"wgmma", 2, -1, 0, 0}, []attnLarge{
			{64, 6, 256, 64, true, tensor.BF16},
			{4, 6, 1000, 64, true, tensor.BF16},
			{2, 4, 777, 64, false, tensor.BF16},
			{1, 2, 1, 64, true, tensor.BF16},
			{3, 5, 130, 128, true, tensor.BF16},
		}},
		{attnPath{"ws", 3, -1, 0, -1}, []attnLarge{
			{8, 16, 2048, 128, true, tensor.BF16},
			{2, 4, 777, 128, false, tensor.BF16},
			{1, 2, 1, 128, true, tensor.BF16},
			{4, 6, 1000, 64, true, tensor.BF16},
			{2, 4, 777, 64, false, tensor.BF16},
		}},
		{attnPath{"ws-persistent", 4, -1, 0, -1}, []attnLarge{
			{8, 16, 2048, 128, true, tensor.BF16},
			{2, 4, 777, 128, false, tensor.BF16},
			{1, 2, 1, 128, true, tensor.BF16},
			{4, 6, 1000, 64, true, tensor.BF16},
			{32, 12, 1024, 64, true, tensor.BF16},
		}},
		{attnPath{"ws-c3", 5, -1, 0, -1}, []attnLarge{
			{4, 6, 1000, 64, true, tensor.BF16},
			{2, 4, 777, 64, false, tensor.BF16},
			{1, 2, 1, 64, true, tensor.BF16},
			{8, 32, 2048, 64, true, tensor.BF16},
		}},
		{attnPath{"ws-c3-persistent", 6, -1, 0, -1}, []attnLarge{
			{4, 6, 1000, 64, true, tensor.BF16},
			{2, 4, 777, 64, false, tensor.BF16},
			{32, 12, 1024, 64, true, tensor.BF16},
		}},
		// The warp-specialised backward, both passes (attnBwdWSMode 2; the
		// default takes the dQ pass's, and the dK/dV pass's at D = 64,
		// which the ws paths above check).
		{attnPath{"bwd-ws", 2, -1, 0, 2}, []attnLarge{
			{8, 16, 2048, 128, true, tensor.BF16},
			{2, 4, 777, 128, false, tensor.BF16},
			{1, 2, 1, 128, true, tensor.BF16},
			{4, 6, 1000, 64, true, tensor.BF16},
			{2, 4, 777, 64, false, tensor.BF16},
		}},
	} {
		for _, c := range p.cases {
			t.Run(p.path.name+"/"+c.String(), func(t *testing.T) {
				cudatest.RequireGPU(t)
				defer p.path.set()()
				attnLargeCheck(t, e, a, r, c)
			})
		}
	}
	// Head dimension 256: attn_fwd_ws_d256 (a forward only) where attnWide
	// allows it (the default), else an error naming what runs.
	for _, c := range []attnLarge{
		{2, 8, 1024, 256, true, tensor.BF16},
		{2, 4, 777, 256, false, tensor.BF16},
		{1, 2, 1, 256, true, tensor.BF16},
	} {
		t.Run("wide/"+c.String(), func(t *testing.T) {
			cudatest.RequireGPU(t)
			at := newAttnTensors(t, a, r, c)
			off := ops.SetAttentionWide(false)
			err := at.forward(e, c)
			off()
			if !errors.Is(err, ops.ErrConfig) {
				t.Fatalf("D = 256 with SetAttentionWide off: %v, want ErrConfig", err)
			}
			if err := at.backward(e, c); !errors.Is(err, ops.ErrConfig) {
				t.Fatalf("D = 256 backward: %v, want ErrConfig", err)
			}
			attnLargeCheck(t, e, a, r, c)
		})
	}
}
