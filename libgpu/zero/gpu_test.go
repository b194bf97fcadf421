package zero_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/dist/launch"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nccl/nccltest"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/zero"
)

// GPU tests. One GPU (TestCUDAZeROOneRank): the ZeRO-1 step of a world of
// one (nccl.Solo) captured and replayed. Several (TestMultiGPUZeRO on 2,
// TestMultiGPU4ZeRO on 4; run by name, GPUKIT_TEST_RUN='^TestMultiGPU',
// with GPUKIT_REQUIRE_GPUS set): ranks re-executing this binary
// (TestZeRORankHelper) joined by NCCL, each running zeroStep (the whole
// ZeRO-1 step — gradients written, buckets reduce-scattered on the
// communication stream, the global-norm clip, AdamW on the rank's parts,
// the parameters all-gathered — captured in a CUDA graph and replayed,
// against optim.AdamW on the host over the averaged gradients) and
// ownedStep (Muon owned per parameter against Muon over every parameter
// on the same GPU).

// TestCUDAZeROOneRank: the ZeRO-1 step on one GPU, one rank.
func TestCUDAZeROOneRank(t *testing.T) {
	cudatest.RequireGPU(t)
	e, a := cudaSetup(t, 0)
	zeroStep(t, e, a, nccl.Solo(e.Device()))
}

// TestMultiGPUZeRO: the ZeRO-1 step and Owned on two GPUs.
func TestMultiGPUZeRO(t *testing.T) {
	nccltest.NeedGPUs(t, 2)
	nccltest.Ranks(t, "TestZeRORankHelper", "zero", []launch.Config{{NProc: 2}})
}

// TestMultiGPU4ZeRO: the same on four GPUs.
func TestMultiGPU4ZeRO(t *testing.T) {
	nccltest.NeedGPUs(t, 4)
	nccltest.Ranks(t, "TestZeRORankHelper", "zero", []launch.Config{{NProc: 4}})
}

// TestZeRORankHelper is one rank of the multi-GPU tests when started by
// nccltest.Ranks, and does nothing otherwise.
func TestZeRORankHelper(t *testing.T) {
	if nccltest.RankMode() == "" {
		return
	}
	w, err := dist.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	visible, err := cuda.DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	ord, err := w.DeviceOrdinal(visible)
	if err != nil {
		t.Fatal(err)
	}
	e, a := cudaSetup(t, ord)
	c, err := nccl.Connect(context.Background(), e, &dist.Rendezvous{World: w, Timeout: 2 * time.Minute, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	zeroStep(t, e, a, c)
	ownedStep(t, e, a, c)
	if err := c.AsyncError(); err != nil {
		t.Fatal(err)
	}
}

func cudaSetup(t *testing.T, ordinal int) (*ops.Engine, device.Allocator) {
	t.Helper()
	d, err := device.NewCUDA(ordinal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	e, err := ops.NewEngine(d, ops.Options{Precision: ops.PrecF32, HighPriorityComm: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, device.Local{Dev: d}
}

// gpuShapes: a small GPT's parameter shapes (several buckets of 1 MiB,
// parameters cut between ranks' parts, a last bucket of 512 KiB).
var gpuShapes = [][]int{{256, 384}, {384}, {1152, 384}, {384, 384}, {1536, 384}, {384, 1536}, {3}, {100, 384}}

// gpuGrad is rank r's gradient of parameter i at replay k, element j:
// multiples of 1/8 up to 2, so the average over 2 or 4 ranks is exact in
// f32 whatever the order.
func gpuGrad(r, i, j, k int) float32 { return float32((j*7+i*11+r*13+k*5)%33-16) / 8 }

// zeroStep captures the ZeRO-1 step on this rank and replays it 4 times
// after one eager step, each with new per-rank gradients; after each, the
// parameters (the same on every rank) and the clipped norm must be those
// of optim.AdamW on the host over the average gradient, within 1e-5; at
// the end the state gathered on rank 0 must be the host AdamW's.
func zeroStep(t *testing.T, e *ops.Engine, a device.Allocator, c zero.Collective) {
	n, rank := c.Size(), c.Rank()
	var dps []dist.Param
	var names []string
	for i, s := range gpuShapes {
		names = append(names, fmt.Sprintf("p%d", i))
		dps = append(dps, dist.Param{Name: names[i], DType: tensor.F32, Shape: s})
	}
	l, err := dist.Plan(dps, dist.BucketConfig{Bytes: 1 << 20, FirstBytes: 256 << 10, LastBytes: 512 << 10, Shards: n})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := l.Alloc(a, "params")
	if err != nil {
		t.Fatal(err)
	}
	defer pv.Free()
	gv, err := l.Alloc(a, "grads")
	if err != nil {
		t.Fatal(err)
	}
	defer gv.Free()
	init := make([][]float32, len(gpuShapes))
	for i, p := range pv.Params {
		init[i] = make([]float32, p.Numel())
		for j := range init[i] {
			init[i][j] = float32((j*3+i)%19-9) / 10
		}
		if err := p.WriteF32(init[i]); err != nil {
			t.Fatal(err)
		}
	}
	red, err := nccl.NewReducer(e, c, l, gv, nccl.Avg)
	if err != nil {
		t.Fatal(err)
	}
	if err := red.Scatter(true); err != nil {
		t.Fatal(err)
	}
	cfg := ops.AdamWConfig{LR: 1e-2, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.1}
	for _, s := range gpuShapes {
		cfg.NoDecay = append(cfg.NoDecay, len(s) < 2)
	}
	one := func() *tensor.Tensor {
		x, err := tensor.Alloc(a, "", tensor.F32, 1)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	norm, coef := one(), one()
	cfg.GradScale = coef
	z, err := zero.NewAdamW(a, "run", c, l, pv, gv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Free()
	const maxNorm = 100 // below the gradients' norm (about 1100): every step clipped
	srcs := make([]*tensor.Tensor, len(gpuShapes))
	flats := make([]*tensor.Tensor, len(gpuShapes))
	for i, p := range gv.Params {
		if srcs[i], err = tensor.Alloc(a, "", tensor.F32, p.Numel()); err != nil {
			t.Fatal(err)
		}
		defer srcs[i].Buf.Free()
		if flats[i], err = p.Reshape(p.Numel()); err != nil {
			t.Fatal(err)
		}
	}
	step := func() error {
		for i := len(srcs) - 1; i >= 0; i-- { // the "backward"
			if err := e.Copy(flats[i], srcs[i]); err != nil {
				return err
			}
			if err := red.Ready(i); err != nil {
				return err
			}
		}
		if err := red.Wait(); err != nil {
			return err
		}
		if err := z.ClipCoef(e, maxNorm, norm, coef); err != nil {
			return err
		}
		return z.Step(e)
	}
	load := func(k int) {
		for i, s := range srcs {
			v := make([]float32, s.Numel())
			for j := range v {
				v[j] = gpuGrad(rank, i, j, k)
			}
			if err := s.WriteF32(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The reference: optim.AdamW on the host over the average gradient.
	he, ha := hostEngine(t)
	ref := named(t, ha, names, gpuShapes, init)
	hcfg := cfg
	hnorm, _ := tensor.Alloc(ha, "", tensor.F32, 1)
	hcoef, _ := tensor.Alloc(ha, "", tensor.F32, 1)
	hcfg.GradScale = hcoef
	opt, err := optim.NewAdamW(ha, "ref", ref, hcfg)
	if err != nil {
		t.Fatal(err)
	}
	var hgrads []*tensor.Tensor
	for _, p := range ref {
		hgrads = append(hgrads, p.Grad)
	}
	refStep := func(k int) {
		for i, p := range ref {
			g := make([]float32, p.Grad.Numel())
			for j := range g {
				s := 0.0
				for r := range n {
					s += float64(gpuGrad(r, i, j, k))
				}
				g[j] = float32(s / float64(n))
			}
			if err := p.Grad.WriteF32(g); err != nil {
				t.Fatal(err)
			}
		}
		if err := he.ClipCoef(hgrads, maxNorm, hnorm, hcoef); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(he); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string) {
		t.Helper()
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		within(t, what+": norm", read(t, norm), read(t, hnorm), 1e-5)
		if read(t, coef)[0] >= 1 {
			t.Fatalf("%s: not clipped", what)
		}
		for i, p := range pv.Params {
			within(t, fmt.Sprintf("%s: %s", what, names[i]), read(t, p), read(t, ref[i].Value), 1e-5)
		}
	}
	load(0)
	if err := step(); err != nil {
		t.Fatal(err)
	}
	refStep(0)
	check("eager")
	graph, err := e.Capture(step)
	if err != nil {
		t.Fatal(err)
	}
	defer graph.Close()
	for k := 1; k <= 4; k++ {
		load(k)
		if err := graph.Launch(); err != nil {
			t.Fatal(err)
		}
		refStep(k)
		check(fmt.Sprint("replay ", k))
	}
	st, err := z.GatherState(e, a, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rank == 0 {
		want := map[string]nn.Param{}
		for _, s := range opt.State() {
			want[s.Name] = s
		}
		if len(st) != len(want) {
			t.Fatalf("gathered %d state tensors, want %d", len(st), len(want))
		}
		for _, s := range st {
			w := want[s.Name]
			if s.Name == "step" {
				if g, h := read32(t, s.Value), read32(t, w.Value); g != h || g != 5 {
					t.Errorf("step %d, host %d, want 5", g, h)
				}
				continue
			}
			within(t, "gathered "+s.Name, read(t, s.Value), read(t, w.Value), 1e-5)
			s.Value.Buf.Free()
		}
	}
	t.Logf("ZeRO-1 AdamW on %d ranks (%d buckets, %d bytes of state here): eager and 4 replays within 1e-5 of the host; state gathered",
		n, len(l.Buckets), z.StateBytes())
}

// ownedStep: Muon (f32) with each parameter owned by one rank (eager
// steps, broadcasts from the owners) gives on every rank what Muon over
// every parameter gives on the same GPU from the same gradients, within
// 1e-5, over 4 steps.
func ownedStep(t *testing.T, e *ops.Engine, a device.Allocator, c zero.Collective) {
	var names []string
	for i := range gpuShapes {
		names = append(names, fmt.Sprintf("p%d", i))
	}
	init := make([][]float32, len(gpuShapes))
	for i, s := range gpuShapes {
		init[i] = make([]float32, tensor.Numel(s))
		for j := range init[i] {
			init[i][j] = float32((j*3+i)%19-9) / 10
		}
	}
	ps, all := named(t, a, names, gpuShapes, init), named(t, a, names, gpuShapes, init)
	// Newton–Schulz in f32 (the engine's GEMMs are full f32): owned and
	// unowned runs batch different sets of matrices, and cuBLASLt may sum
	// a batch of another size in another order; in bf16 that alone moves
	// an update by about 1e-3 of itself.
	mc := optim.DefaultMuon
	mc.F32 = true
	build := func(ps []nn.Param) (optim.Optimizer, error) { return optim.NewMuon(a, "muon", ps, mc) }
	o, err := zero.NewOwned(c, ps, nil, build)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Free()
	u, err := build(all)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Free()
	for k := range 4 {
		for i := range ps {
			g := make([]float32, ps[i].Grad.Numel())
			for j := range g {
				g[j] = gpuGrad(0, i, j, k)
			}
			if err := ps[i].Grad.WriteF32(g); err != nil {
				t.Fatal(err)
			}
			if err := all[i].Grad.WriteF32(g); err != nil {
				t.Fatal(err)
			}
		}
		if err := o.Step(e); err != nil {
			t.Fatal(err)
		}
		if err := u.Step(e); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		for i := range ps {
			within(t, fmt.Sprintf("owned Muon, step %d: %s (owner %d)", k, names[i], o.Owner(i)), read(t, ps[i].Value), read(t, all[i].Value), 1e-5)
		}
	}
	t.Logf("owned Muon on %d ranks: 4 steps within 1e-5 of Muon over every parameter", c.Size())
}
