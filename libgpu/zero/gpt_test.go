package zero_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nccl/nccltest"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/zero"
)

// gptCfg is a GPT small enough to train on the host in a test, with a
// tied head and LayerNorm weights (vectors without weight decay). No
// biases: the key projection's bias has a gradient of exactly zero in
// exact arithmetic (softmax does not change when a constant is added to
// every score), so its f32 gradient is rounding noise of 1e-13 that
// AdamW's normalisation turns into steps of 1e-7 in directions that
// depend on the order of sums (seen: 5e-6 apart after 10 steps between
// two valid orders on one rank).
var gptCfg = nn.GPTConfig{Vocab: 11, Layers: 2, Heads: 2, DModel: 8, Block: 5}

const (
	gptBatch = 4 // global batch (sequences)
	gptSteps = 10
	gptClip  = 0.5
)

// gptData is step s's global batch (inputs and targets, [gptBatch,
// Block] row-major), the same for every world size.
func gptData(seed uint64, s int) (x, y []int32) {
	r := rand.New(rand.NewPCG(seed, uint64(s)))
	n := gptBatch * gptCfg.Block
	x, y = make([]int32, n), make([]int32, n)
	for i := range x {
		x[i], y[i] = int32(r.IntN(gptCfg.Vocab)), int32(r.IntN(gptCfg.Vocab))
	}
	return x, y
}

// gptAdam is the tests' AdamW. Its ε is 1e-3, about the gradients' size,
// and its learning rate 3e-3: with ε = 1e-8 AdamW divides each gradient by
// its own magnitude, so a gradient that sums to ~1e-6 from terms of ~1e-3
// carries a rounding error of 1e-4 of itself into a step of the learning
// rate's size, and two valid summation orders (one rank against two)
// ended 10 steps up to 4.6e-4 of a parameter's scale apart (26 seeds of
// 400 beyond 1e-5 at learning rate 1e-2; CI seed 9772269453033428695:
// 1.4e-5 on h.0.mlp's hidden unit 12). With these values the largest
// difference over 1,000 host seeds was 6.4e-7, and sharding changes
// nothing else: the code paths are the same.
func gptAdam(m *nn.GPT) ops.AdamWConfig {
	c := ops.AdamWConfig{LR: 3e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-3, WeightDecay: 0.1}
	for _, p := range m.Params() {
		c.NoDecay = append(c.NoDecay, p.Value.Rank() < 2)
	}
	return c
}

// TestGPTSharded is the data-parallel ZeRO-1 training step as a trainer
// wires it, on 1, 2 and 4 ranks of the in-process stand-in: a GPT whose
// parameters and gradients live in bucket storage cut into one part per
// rank (nn.GPT.SetParams, SetGrads), each rank's rows of the global
// batch, the backward marking gradients ready (Tape.OnGradReady →
// Reducer.Ready, the reducer in Scatter mode), Wait, the global-norm
// clip (zero.AdamW.ClipCoef, fused into the update as GradScale) and
// zero.AdamW.Step (the update of the rank's parts, the all-gather). Over
// 10 steps the mean of the ranks' losses is one process's loss on the
// whole batch (optim.AdamW, ops.Engine.ClipCoef) and the parameters are
// its parameters, within 1e-5.
func TestGPTSharded(t *testing.T) {
	seed := opstest.TestSeed(t)
	// One process, no sharding.
	e, a := hostEngine(t)
	ref, err := nn.NewGPT(a, "", gptCfg, true, 7)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ref.Record(e, a, "", gptBatch, ops.GraphOptions{}, true)
	if err != nil {
		t.Fatal(err)
	}
	cfg := gptAdam(ref)
	norm, _ := tensor.Alloc(a, "", tensor.F32, 1)
	coef, _ := tensor.Alloc(a, "", tensor.F32, 1)
	cfg.GradScale = coef
	opt, err := optim.NewAdamW(a, "", ref.Params(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var grads []*tensor.Tensor
	for _, p := range ref.Params() {
		grads = append(grads, p.Grad)
	}
	var wantLoss []float32
	clipped := 0
	for s := range gptSteps {
		x, y := gptData(seed, s)
		if err := rs.Idx.Write(tensor.AsBytes(x)); err != nil {
			t.Fatal(err)
		}
		if err := rs.Targets.Write(tensor.AsBytes(y)); err != nil {
			t.Fatal(err)
		}
		for _, f := range []func() error{rs.Graph.Forward, rs.Graph.Backward,
			func() error { return e.ClipCoef(grads, gptClip, norm, coef) }, func() error { return opt.Step(e) }} {
			if err := f(); err != nil {
				t.Fatal(err)
			}
		}
		wantLoss = append(wantLoss, read(t, rs.Loss)[0])
		if read(t, coef)[0] < 1 {
			clipped++
		}
	}
	if clipped == 0 {
		t.Fatalf("no step was clipped (bound %v): the test would not check the global norm", gptClip)
	}
	t.Logf("%d of %d steps clipped", clipped, gptSteps)
	for _, n := range []int{1, 2, 4} {
		losses := make([][]float32, n)
		params := make([][][]float32, n)
		var mu sync.Mutex
		err := nccltest.Run(n, func(c *nccltest.Comm) error {
			loss, ps, err := shardedGPT(c, seed)
			mu.Lock()
			losses[c.Rank()], params[c.Rank()] = loss, ps
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatalf("%d ranks: %v", n, err)
		}
		mean := make([]float32, gptSteps)
		for s := range mean {
			sum := 0.0
			for r := range n {
				sum += float64(losses[r][s])
			}
			mean[s] = float32(sum / float64(n))
		}
		within(t, fmt.Sprintf("%d ranks: losses", n), mean, wantLoss, 1e-5)
		for i, p := range ref.Params() {
			for r := range n {
				within(t, fmt.Sprintf("%d ranks: rank %d's %s", n, r, p.Name), params[r][i], read(t, p.Value), 1e-5)
			}
		}
	}
}

// shardedGPT is one rank's run of TestGPTSharded: its losses and final
// parameters.
func shardedGPT(c zero.Collective, seed uint64) (losses []float32, params [][]float32, err error) {
	e, a := hostEngine(nil)
	n, rank := c.Size(), c.Rank()
	m, err := nn.NewGPT(a, "", gptCfg, false, 7)
	if err != nil {
		return nil, nil, err
	}
	defer m.Free()
	var dps []dist.Param
	idx := map[string]int{}
	for i, p := range m.Params() {
		dps = append(dps, dist.Param{Name: p.Name, DType: p.Value.DType, Shape: p.Value.Shape})
		idx[p.Name] = i
	}
	l, err := dist.Plan(dps, dist.BucketConfig{Bytes: 1 << 10, FirstBytes: 256, LastBytes: 512, Shards: n})
	if err != nil {
		return nil, nil, err
	}
	pv, err := l.Alloc(a, "params")
	if err != nil {
		return nil, nil, err
	}
	defer pv.Free()
	gv, err := l.Alloc(a, "grads")
	if err != nil {
		return nil, nil, err
	}
	defer gv.Free()
	if err := m.SetParams(pv.Params); err != nil {
		return nil, nil, err
	}
	if err := m.SetGrads(gv.Params); err != nil {
		return nil, nil, err
	}
	b := gptBatch / n
	st, err := m.Record(e, a, "", b, ops.GraphOptions{Shard: rank}, true)
	if err != nil {
		return nil, nil, err
	}
	defer st.Free()
	red, err := nccl.NewReducer(e, c, l, gv, nccl.Avg)
	if err != nil {
		return nil, nil, err
	}
	if err := red.Scatter(true); err != nil {
		return nil, nil, err
	}
	st.Graph.Tape().OnGradReady(func(v *ops.Var) error { return red.Ready(idx[v.Name]) })
	cfg := gptAdam(m)
	norm, _ := tensor.Alloc(a, "", tensor.F32, 1)
	coef, _ := tensor.Alloc(a, "", tensor.F32, 1)
	cfg.GradScale = coef
	z, err := zero.NewAdamW(a, "", c, l, pv, gv, cfg)
	if err != nil {
		return nil, nil, err
	}
	defer z.Free()
	rows := b * gptCfg.Block
	for s := range gptSteps {
		x, y := gptData(seed, s)
		if err := st.Idx.Write(tensor.AsBytes(x[rank*rows : (rank+1)*rows])); err != nil {
			return nil, nil, err
		}
		if err := st.Targets.Write(tensor.AsBytes(y[rank*rows : (rank+1)*rows])); err != nil {
			return nil, nil, err
		}
		for _, f := range []func() error{st.Graph.Forward, st.Graph.Backward, red.Wait,
			func() error { return z.ClipCoef(e, gptClip, norm, coef) }, func() error { return z.Step(e) }} {
			if err := f(); err != nil {
				return nil, nil, err
			}
		}
		v, err := st.Loss.ReadF32()
		if err != nil {
			return nil, nil, err
		}
		losses = append(losses, v[0])
	}
	for _, p := range m.Params() {
		v, err := p.Value.ReadF32()
		if err != nil {
			return nil, nil, err
		}
		params = append(params, v)
	}
	return losses, params, nil
}
