package zero_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nccl/nccltest"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/zero"
)

// ownedShapes: matrices (some over the block size 16 of the test's
// Shampoo and SOAP, one the transpose of another, as Muon batches them)
// and vectors (AdamW in Muon, grafting in Shampoo).
var ownedShapes = [][]int{{16, 12}, {12}, {24, 8}, {8, 24}, {5}, {30, 6}, {6}}

// builders make each second-order optimizer over some parameters.
var builders = map[string]func(a device.Allocator, ps []nn.Param) (optim.Optimizer, error){
	"muon": func(a device.Allocator, ps []nn.Param) (optim.Optimizer, error) {
		c := optim.DefaultMuon
		c.AdamW = ops.AdamWConfig{LR: 1e-2, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.01}
		return optim.NewMuon(a, "muon", ps, c)
	},
	"shampoo": func(a device.Allocator, ps []nn.Param) (optim.Optimizer, error) {
		c := optim.DefaultShampoo
		c.LR, c.MaxBlock, c.UpdateFreq = 1e-2, 16, 4
		return optim.NewShampoo(a, "shampoo", ps, c)
	},
	"soap": func(a device.Allocator, ps []nn.Param) (optim.Optimizer, error) {
		c := optim.DefaultSOAP
		c.MaxBlock, c.UpdateFreq = 16, 4
		return optim.NewSOAP(a, "soap", ps, c)
	},
}

// ownedReference runs steps [0, steps) of the problem with the optimizer
// over every parameter on one process (the global gradient).
func ownedReference(t *testing.T, pb *problem, name string, steps int) [][]float32 {
	e, a := hostEngine(t)
	ps := named(t, a, pb.names, pb.shapes, pb.init)
	opt, err := builders[name](a, ps)
	if err != nil {
		t.Fatal(err)
	}
	defer opt.Free()
	for s := range steps {
		for i, p := range ps {
			if err := p.Grad.WriteF32(pb.grad(i, read(t, p.Value), s, 0, shards)); err != nil {
				t.Fatal(err)
			}
		}
		if err := opt.Step(e); err != nil {
			t.Fatal(err)
		}
	}
	var out [][]float32
	for _, p := range ps {
		out = append(out, read(t, p.Value))
	}
	return out
}

// ownedRun runs steps [from, to) on n ranks with zero.Owned over the
// optimizer: every rank holds the global gradient (what the all-reduce
// gives), steps its own parameters and broadcasts them. resume and save
// as shardedRun's. Every rank must end with the same parameters.
func ownedRun(t *testing.T, pb *problem, name string, n, from, to int, resume, save string) [][]float32 {
	params := make([][][]float32, n)
	var mu sync.Mutex
	err := nccltest.Run(n, func(c *nccltest.Comm) error {
		e, a := hostEngine(t)
		ps := named(t, a, pb.names, pb.shapes, pb.init)
		o, err := zero.NewOwned(c, ps, nil, func(own []nn.Param) (optim.Optimizer, error) { return builders[name](a, own) })
		if err != nil {
			return err
		}
		defer o.Free()
		if resume != "" {
			f, err := ckpt.ReadFile(resume)
			if err != nil {
				return err
			}
			for _, p := range ps {
				if err := f.Load(p.Name, p.Value); err != nil {
					return err
				}
			}
			if err := o.LoadState(func(n string, t *tensor.Tensor) error { return f.Load("optim/"+n, t) }); err != nil {
				return err
			}
		}
		for s := from; s < to; s++ {
			for i, p := range ps {
				v, err := p.Value.ReadF32()
				if err != nil {
					return err
				}
				if err := p.Grad.WriteF32(pb.grad(i, v, s, 0, shards)); err != nil {
					return err
				}
			}
			if err := o.Step(e); err != nil {
				return err
			}
		}
		var out [][]float32
		for _, p := range ps {
			v, err := p.Value.ReadF32()
			if err != nil {
				return err
			}
			out = append(out, v)
		}
		mu.Lock()
		params[c.Rank()] = out
		mu.Unlock()
		if save == "" {
			return nil
		}
		st, err := o.GatherState(e, a, 0)
		if err != nil {
			return err
		}
		if c.Rank() != 0 {
			return nil
		}
		var ts []ckpt.Named
		for _, p := range ps {
			ts = append(ts, ckpt.Named{Name: p.Name, T: p.Value})
		}
		for _, s := range st {
			ts = append(ts, ckpt.Named{Name: "optim/" + s.Name, T: s.Value})
		}
		return ckpt.Save(save, ts, nil)
	})
	if err != nil {
		t.Fatalf("%s on %d ranks: %v", name, n, err)
	}
	for r := 1; r < n; r++ {
		if !reflect.DeepEqual(params[r], params[0]) {
			t.Fatalf("%s on %d ranks: rank %d's parameters differ from rank 0's", name, n, r)
		}
	}
	return params[0]
}

// TestOwnedMatchesUnsharded: Muon, Shampoo and SOAP with each parameter
// owned by one of 1, 2 or 3 ranks (state and preconditioner work split,
// parameters broadcast from their owners after each step) train as the
// optimizer over every parameter does on one process, within 1e-5 over
// 12 steps (three preconditioner refreshes).
func TestOwnedMatchesUnsharded(t *testing.T) {
	pb := newProblem(t, ownedShapes)
	for _, name := range []string{"muon", "shampoo", "soap"} {
		want := ownedReference(t, pb, name, 12)
		for n := 1; n <= 3; n++ {
			got := ownedRun(t, pb, name, n, 0, 12, "", "")
			for i := range want {
				within(t, fmt.Sprintf("%s, %d ranks: %s", name, n, pb.names[i]), got[i], want[i], 1e-5)
			}
		}
	}
}

// TestOwnedResume: Muon's state (per parameter) gathered from 3 ranks
// into a checkpoint under the unsharded names resumes on 2 ranks to the
// uninterrupted run's result; Shampoo's state, stacked across
// parameters, is refused with ErrState instead of being saved wrong.
func TestOwnedResume(t *testing.T) {
	pb := newProblem(t, ownedShapes)
	dir := t.TempDir()
	want := ownedReference(t, pb, "muon", 12)
	ck := filepath.Join(dir, "3.safetensors")
	ownedRun(t, pb, "muon", 3, 0, 6, "", ck)
	f, err := ckpt.ReadFile(ck)
	if err != nil {
		t.Fatal(err)
	}
	_, a := hostEngine(t)
	plain, err := builders["muon"](a, named(t, a, pb.names, pb.shapes, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range plain.State() { // the unsharded optimizer's names, all there
		if _, _, err := f.Bytes("optim/" + s.Name); err != nil {
			t.Errorf("the gathered checkpoint lacks %s: %v", s.Name, err)
		}
	}
	got := ownedRun(t, pb, "muon", 2, 6, 12, ck, "")
	for i := range want {
		within(t, "muon 3 → 2 ranks: "+pb.names[i], got[i], want[i], 1e-5)
	}
	err = nccltest.Run(2, func(c *nccltest.Comm) error {
		e, a := hostEngine(t)
		ps := named(t, a, pb.names, pb.shapes, pb.init)
		o, err := zero.NewOwned(c, ps, nil, func(own []nn.Param) (optim.Optimizer, error) { return builders["shampoo"](a, own) })
		if err != nil {
			return err
		}
		if _, err := o.GatherState(e, a, 0); !errors.Is(err, zero.ErrState) {
			return fmt.Errorf("Shampoo's GatherState: %v, want ErrState", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAssign: the greedy rule on a worked example, every rank owning
// something, and a rank left with nothing refused by NewOwned.
func TestAssign(t *testing.T) {
	_, a := hostEngine(t)
	ps := named(t, a, []string{"a", "b", "c", "d", "e"}, [][]int{{4, 4}, {10}, {8, 8}, {3}, {2, 2}}, nil)
	// Costs: a 64, b 10, c 512, d 3, e 8. c → 0; a → 1; b → 1 (64 < 512);
	// e → 1 (74); d → 1 (82).
	if got, want := zero.Assign(ps, 2, nil), []int{1, 1, 0, 1, 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("Assign: %v, want %v", got, want)
	}
	if got, want := zero.Assign(ps, 3, nil), []int{1, 2, 0, 2, 2}; !reflect.DeepEqual(got, want) {
		t.Errorf("Assign 3 ranks: %v, want %v", got, want)
	}
	if _, err := zero.NewOwned(nccltest.NewWorld(6).Comm(0), ps, nil, nil); !errors.Is(err, zero.ErrConfig) {
		t.Errorf("6 ranks, 5 parameters: %v", err)
	}
}
