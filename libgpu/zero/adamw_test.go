package zero_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nccl/nccltest"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/zero"
)

var adamCfg = ops.AdamWConfig{LR: 2e-2, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.1}

// shapes of the synthetic problems: matrices and vectors (no decay), one
// of a single element, sizes that cut across buckets and parts.
var shapes = [][]int{{37, 11}, {5}, {130}, {64, 3}, {1}, {9, 9}, {200}, {3, 70}}

// bucketsFor is the synthetic problems' bucket plan for n ranks: buckets
// of about 175 f32, a first of 50 and a last of at most 75 (several
// buckets, parameters cut between ranks' parts).
func bucketsFor(n int) dist.BucketConfig {
	return dist.BucketConfig{Bytes: 700, FirstBytes: 200, LastBytes: 300, Align: 16, Shards: n}
}

// result is what a run ends with.
type result struct {
	params [][]float32          // per parameter
	state  map[string][]float32 // the optimizer state by checkpoint name
	norms  []float32            // the gradient norm of every step (clipping)
}

// reference runs the problem's steps [0, steps) on one process without
// sharding: optim.AdamW over every parameter, the global gradient,
// clipped to maxNorm (> 0; fused as GradScale) — what the sharded runs
// must reproduce.
func reference(t *testing.T, pb *problem, steps int, maxNorm float32) result {
	e, a := hostEngine(t)
	ps := named(t, a, pb.names, pb.shapes, pb.init)
	cfg := adamCfg
	cfg.NoDecay = pb.noDecay()
	var norm, coef *tensor.Tensor
	var err error
	if maxNorm > 0 {
		norm, _ = tensor.Alloc(a, "", tensor.F32, 1)
		coef, _ = tensor.Alloc(a, "", tensor.F32, 1)
		cfg.GradScale = coef
	}
	opt, err := optim.NewAdamW(a, "ref", ps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var res result
	var grads []*tensor.Tensor
	for _, p := range ps {
		grads = append(grads, p.Grad)
	}
	for s := range steps {
		for i, p := range ps {
			if err := p.Grad.WriteF32(pb.grad(i, read(t, p.Value), s, 0, shards)); err != nil {
				t.Fatal(err)
			}
		}
		if maxNorm > 0 {
			if err := e.ClipCoef(grads, maxNorm, norm, coef); err != nil {
				t.Fatal(err)
			}
			res.norms = append(res.norms, read(t, norm)[0])
		}
		if err := opt.Step(e); err != nil {
			t.Fatal(err)
		}
	}
	res.state = map[string][]float32{}
	for _, p := range ps {
		res.params = append(res.params, read(t, p.Value))
	}
	for _, s := range opt.State() {
		if s.Value.DType == tensor.I32 {
			res.state[s.Name] = []float32{float32(read32(t, s.Value))}
			continue
		}
		res.state[s.Name] = read(t, s.Value)
	}
	return res
}

func read32(t testing.TB, x *tensor.Tensor) int32 {
	b, err := x.Read()
	if err != nil {
		t.Fatal(err)
	}
	return tensor.BytesAs[int32](b)[0]
}

// shardedRun runs the problem's steps [from, to) on n ranks of the
// in-process stand-in with ZeRO-1: buckets reduce-scattered by the
// reducer, zero.AdamW on each rank's parts (global-norm clipping to
// maxNorm > 0), the parameters all-gathered. With resume it starts from
// that checkpoint (parameters and optimizer state, every rank loading
// it); with save it writes one at the end from rank 0 (the state gathered
// there). It checks that every rank ends with the same parameters and
// returns rank 0's, the gathered state and rank 0's norms.
func shardedRun(t *testing.T, pb *problem, n, from, to int, maxNorm float32, resume, save string) result {
	l, err := dist.Plan(pb.distParams(), bucketsFor(n))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	params := make([][][]float32, n)
	var res result
	err = nccltest.Run(n, func(c *nccltest.Comm) error {
		e, a := hostEngine(t)
		pv, err := l.Alloc(a, "params")
		if err != nil {
			return err
		}
		gv, err := l.Alloc(a, "grads")
		if err != nil {
			return err
		}
		defer pv.Free()
		defer gv.Free()
		for i, p := range pv.Params {
			if err := p.WriteF32(pb.init[i]); err != nil {
				return err
			}
		}
		red, err := nccl.NewReducer(e, c, l, gv, nccl.Avg)
		if err != nil {
			return err
		}
		if err := red.Scatter(true); err != nil {
			return err
		}
		cfg := adamCfg
		cfg.NoDecay = pb.noDecay()
		norm, _ := tensor.Alloc(a, "", tensor.F32, 1)
		coef, _ := tensor.Alloc(a, "", tensor.F32, 1)
		if maxNorm > 0 {
			cfg.GradScale = coef
		}
		z, err := zero.NewAdamW(a, "run", c, l, pv, gv, cfg)
		if err != nil {
			return err
		}
		defer z.Free()
		if resume != "" {
			f, err := ckpt.ReadFile(resume)
			if err != nil {
				return err
			}
			for i, p := range pv.Params {
				if err := f.Load(pb.names[i], p); err != nil {
					return err
				}
			}
			if err := z.LoadState(func(name string, t *tensor.Tensor) error { return f.Load("optim/"+name, t) }); err != nil {
				return err
			}
		}
		per := shards / n
		var norms []float32
		for s := from; s < to; s++ {
			for i := len(pv.Params) - 1; i >= 0; i-- {
				p, err := pv.Params[i].ReadF32()
				if err != nil {
					return err
				}
				if err := gv.Params[i].WriteF32(pb.grad(i, p, s, c.Rank()*per, (c.Rank()+1)*per)); err != nil {
					return err
				}
				if err := red.Ready(i); err != nil {
					return err
				}
			}
			if err := red.Wait(); err != nil {
				return err
			}
			if maxNorm > 0 {
				if err := z.ClipCoef(e, maxNorm, norm, coef); err != nil {
					return err
				}
				v, err := norm.ReadF32()
				if err != nil {
					return err
				}
				norms = append(norms, v[0])
			}
			if err := z.Step(e); err != nil {
				return err
			}
		}
		var ps [][]float32
		for _, p := range pv.Params {
			v, err := p.ReadF32()
			if err != nil {
				return err
			}
			ps = append(ps, v)
		}
		st, err := z.GatherState(e, a, 0)
		if err != nil {
			return err
		}
		mu.Lock()
		params[c.Rank()] = ps
		mu.Unlock()
		if c.Rank() != 0 {
			if st != nil {
				return fmt.Errorf("rank %d got the gathered state", c.Rank())
			}
			return nil
		}
		res.state = map[string][]float32{}
		var named []ckpt.Named
		for i, p := range pv.Params {
			named = append(named, ckpt.Named{Name: pb.names[i], T: p})
		}
		for _, s := range st {
			named = append(named, ckpt.Named{Name: "optim/" + s.Name, T: s.Value})
			if s.Value.DType == tensor.I32 {
				b, _ := s.Value.Read()
				res.state[s.Name] = []float32{float32(tensor.BytesAs[int32](b)[0])}
			} else {
				res.state[s.Name], _ = s.Value.ReadF32()
			}
		}
		if save != "" {
			if err := ckpt.Save(save, named, nil); err != nil {
				return err
			}
		}
		for _, s := range st {
			s.Value.Buf.Free()
		}
		res.norms = norms
		return nil
	})
	if err != nil {
		t.Fatalf("%d ranks: %v", n, err)
	}
	for r := 1; r < n; r++ {
		for i := range params[r] {
			for j := range params[r][i] {
				if params[r][i][j] != params[0][i][j] {
					t.Fatalf("%d ranks: rank %d's %s[%d] = %v, rank 0's %v", n, r, pb.names[i], j, params[r][i][j], params[0][i][j])
				}
			}
		}
	}
	res.params = params[0]
	return res
}

// compare checks a run against the reference: parameters and state
// within tol of the values' size (a moment relative to the largest of
// its kind over all parameters: the size of the gradients it averages),
// the step counters equal, the norms within tol.
func compare(t *testing.T, what string, pb *problem, got, want result, tol float64) {
	t.Helper()
	for i := range want.params {
		within(t, fmt.Sprintf("%s: %s", what, pb.names[i]), got.params[i], want.params[i], tol)
	}
	if len(got.state) != len(want.state) {
		t.Errorf("%s: %d state tensors, want %d", what, len(got.state), len(want.state))
	}
	for name, w := range want.state {
		g, ok := got.state[name]
		switch {
		case !ok:
			t.Errorf("%s: no state %q", what, name)
		case name == "step":
			if g[0] != w[0] {
				t.Errorf("%s: step %v, want %v", what, g[0], w[0])
			}
		default:
			kind := name[strings.LastIndex(name, "."):]
			withinScale(t, fmt.Sprintf("%s: state %s", what, name), g, w, tol, maxAbs(want.state, kind))
		}
	}
	if len(want.norms) > 0 {
		within(t, what+": gradient norms", got.norms, want.norms[len(want.norms)-len(got.norms):], tol)
	}
}

// TestAdamWMatchesUnsharded: ZeRO-1 AdamW on 1, 2 and 4 ranks of the
// in-process stand-in (gradients reduce-scattered, state split, the
// parameters all-gathered) trains as one process with optim.AdamW over
// the global gradient does, over 60 steps: every rank's parameters, the
// gathered state and the clipped steps' global norms within 1e-5 (f32),
// with and without clipping (the bound is below the gradients' norm, so
// every clipped step scales).
func TestAdamWMatchesUnsharded(t *testing.T) {
	pb := newProblem(t, shapes)
	const steps = 60
	for _, maxNorm := range []float32{0, 5} {
		want := reference(t, pb, steps, maxNorm)
		if maxNorm > 0 && want.norms[steps-1] <= maxNorm {
			t.Fatalf("the last step's norm %v does not reach the bound %v", want.norms[steps-1], maxNorm)
		}
		for _, n := range []int{1, 2, 4} {
			got := shardedRun(t, pb, n, 0, steps, maxNorm, "", "")
			compare(t, fmt.Sprintf("%d ranks, clip %v", n, maxNorm), pb, got, want, 1e-5)
		}
	}
}

// TestAdamWResumeAcrossWorldSizes: a run on 4 ranks checkpoints (whole
// tensors, the state gathered on rank 0), resumes on 2 ranks (each taking
// its parts), checkpoints, resumes on 1: the end is the uninterrupted
// one-process run's within 1e-5; and optim.AdamW (no sharding) loads the
// sharded run's checkpoint as its own.
func TestAdamWResumeAcrossWorldSizes(t *testing.T) {
	pb := newProblem(t, shapes)
	dir := t.TempDir()
	want := reference(t, pb, 45, 5)
	a, b := filepath.Join(dir, "4.safetensors"), filepath.Join(dir, "2.safetensors")
	shardedRun(t, pb, 4, 0, 15, 5, "", a)
	shardedRun(t, pb, 2, 15, 30, 5, a, b)
	got := shardedRun(t, pb, 1, 30, 45, 5, b, filepath.Join(dir, "1.safetensors"))
	compare(t, "4 → 2 → 1 ranks", pb, got, want, 1e-5)

	f, err := ckpt.ReadFile(filepath.Join(dir, "1.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	_, al := hostEngine(t)
	ps := named(t, al, pb.names, pb.shapes, nil)
	opt, err := optim.NewAdamW(al, "plain", ps, adamCfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range opt.State() {
		if err := f.Load("optim/"+s.Name, s.Value); err != nil {
			t.Fatalf("optim.AdamW loading the sharded checkpoint: %v", err)
		}
		if s.Name == "step" {
			if v := read32(t, s.Value); v != 45 {
				t.Errorf("step %d, want 45", v)
			}
			continue
		}
		within(t, "plain AdamW's "+s.Name, read(t, s.Value), got.state[s.Name], 0)
	}
}

// TestAdamWErrors: the layout must have one part per rank; a rank whose
// parts hold no parameter is refused; NoDecay has one entry per
// parameter.
func TestAdamWErrors(t *testing.T) {
	_, a := hostEngine(t)
	ps := []dist.Param{{Name: "w", DType: tensor.F32, Shape: []int{4}}}
	w := nccltest.NewWorld(2)
	for _, c := range []struct {
		what  string
		cfg   dist.BucketConfig
		world *nccltest.World
		rank  int
		nd    []bool
	}{
		{"2 parts, 3 ranks", dist.BucketConfig{Shards: 2}, nccltest.NewWorld(3), 0, nil},
		// 4 elements, 8 parts of 4 (align 16 B): rank 1's part is padding.
		{"a rank with nothing", dist.BucketConfig{Shards: 8, Align: 16}, nccltest.NewWorld(8), 1, nil},
		{"NoDecay", dist.BucketConfig{Shards: 2}, w, 0, []bool{true, false}},
	} {
		l, err := dist.Plan(ps, c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		pv, _ := l.Alloc(a, "")
		gv, _ := l.Alloc(a, "")
		cfg := adamCfg
		cfg.NoDecay = c.nd
		if _, err := zero.NewAdamW(a, "", c.world.Comm(c.rank), l, pv, gv, cfg); !errors.Is(err, zero.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", c.what, err)
		}
	}
}
