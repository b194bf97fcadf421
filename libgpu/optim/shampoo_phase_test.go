package optim_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// groupShapes interleave block shapes (MaxBlock 3): [7,5] and [3,3] share
// blocks of 3×3, [2,6] has 2×3 blocks that share the order-3 class with
// them, [4] and [5] take the graft only.
var groupShapes = [][]int{{7, 5}, {4}, {2, 6}, {3, 3}, {5}, {2, 6}}

// TestShampooGroupsMatchReference: parameters batched by block shape
// (their blocks stacked across parameters in the statistics classes)
// still follow the float64 reference parameter by parameter, with a
// device learning-rate scale that changes every step.
func TestShampooGroupsMatchReference(t *testing.T) {
	seed := opstest.TestSeed(t)
	for _, async := range []bool{false, true} {
		cfg := testShampooConfig()
		cfg.Roots.Async, cfg.Roots.MaxStaleness = async, map[bool]int{false: 0, true: 1}[async]
		p := hostProblem(t, groupShapes...)
		r := rand.New(rand.NewPCG(seed, 5))
		w := roundF32(draws(r, 1, groupShapes))
		p.set(w)
		o, err := optim.NewShampoo(p.a, "run", p.params, cfg)
		if err != nil {
			t.Fatal(err)
		}
		scale := opstest.Empty(t, p.a, tensor.F32, 1)
		o.SetLRScale(scale)
		ref := newRefShampoo(cfg, groupShapes)
		for step := 1; step <= 9; step++ {
			s := float32(1 - 0.08*float64(step)) // a decaying schedule
			if err := scale.WriteFloat32([]float32{s}); err != nil {
				t.Fatal(err)
			}
			ref.cfg.LR = cfg.LR * s
			g := roundF32(draws(r, 1, groupShapes))
			p.grads(g)
			if err := o.Step(p.e); err != nil {
				t.Fatal(err)
			}
			ref.step(w, g)
			if e := relErr(p.values(), w); !(e < 2e-5) {
				t.Fatalf("async %v, step %d: relative error %.3g against the float64 reference", async, step, e)
			}
		}
		o.Free()
	}
}

// TestLaunchesPerStep: a Shampoo or SOAP step queues a fixed number of
// ops per block shape, whatever the number of parameters of that shape:
// the statistics', rotations' and preconditioning's GEMMs are batched
// over the shape's blocks, and the element-wise steps are multi-tensor
// ops over its parameters (on a GPU one launch per 32 of them).
func TestLaunchesPerStep(t *testing.T) {
	for _, v := range []struct {
		name      string
		mk        func(p *problem) (optim.Optimizer, error)
		one, each int64
	}{
		// 1 counter + per shape: prep, 2 statistics GEMMs, 2
		// preconditioning GEMMs, graft scale, apply.
		{"shampoo", func(p *problem) (optim.Optimizer, error) {
			cfg := testShampooConfig()
			cfg.StartStep, cfg.UpdateFreq = 1, 5
			return optim.NewShampoo(p.a, "run", p.params, cfg)
		}, 1 + 7, 0},
		// 1 counter (leaving t−1's corrections) + per shape: prep, 2
		// statistics GEMMs, 4 rotations, Adam in the eigenbasis, 2 back,
		// apply.
		{"soap", func(p *problem) (optim.Optimizer, error) {
			cfg := testSOAPConfig()
			cfg.MaxBlock, cfg.UpdateFreq = 3, 5
			return optim.NewSOAP(p.a, "run", p.params, cfg)
		}, 1 + 11, 0},
	} {
		count := func(n int) int64 {
			shapes := make([][]int, n)
			for i := range shapes {
				shapes[i] = []int{6, 4}
			}
			p := hostProblem(t, shapes...)
			r := newRand(11)
			p.set(draws(r, 1, shapes))
			o, err := v.mk(p)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Free()
			var ops int64
			for step := 1; step <= 3; step++ { // step 1 refreshes; 2 and 3 precondition only
				p.grads(draws(r, 1, shapes))
				before := p.e.Queued()
				if err := o.Step(p.e); err != nil {
					t.Fatal(err)
				}
				ops = p.e.Queued() - before
			}
			return ops
		}
		one, eight := count(1), count(8)
		if one != v.one || eight-one != 7*v.each {
			t.Fatalf("%s: ops per preconditioned step: %d for one parameter, %d for eight of one shape (want %d and %d)",
				v.name, one, eight, v.one, v.one+7*v.each)
		}
	}
}

// TestPhases: NextPhase is −1 exactly at the steps where the host acts
// (the first, a refresh due, an asynchronous refresh put in use); steps
// replayed in place of Step at the other steps — their device work queued
// while the host believes it is the step the phase was captured at —
// leave every parameter bitwise as eager steps do (Shampoo and SOAP,
// synchronous and asynchronous refreshes, a learning-rate scale that
// changes every step; K-FAC with static layers' factors, at a constant
// learning rate).
func TestPhases(t *testing.T) {
	seed := opstest.TestSeed(t)
	shampoo := func(async bool, stale int) func(p *problem) (optim.Optimizer, error) {
		return func(p *problem) (optim.Optimizer, error) {
			cfg := testShampooConfig()
			cfg.StartStep, cfg.UpdateFreq = 3, 4
			cfg.Roots.Async, cfg.Roots.MaxStaleness = async, stale
			return optim.NewShampoo(p.a, "run", p.params, cfg)
		}
	}
	soap := func(async bool, stale int) func(p *problem) (optim.Optimizer, error) {
		return func(p *problem) (optim.Optimizer, error) {
			cfg := testSOAPConfig()
			cfg.MaxBlock, cfg.UpdateFreq = 3, 4
			cfg.Roots.Async, cfg.Roots.MaxStaleness = async, stale
			return optim.NewSOAP(p.a, "run", p.params, cfg)
		}
	}
	kfac := func(p *problem) (optim.Optimizer, error) {
		return kfacMaker(func(c *optim.KFACConfig) { c.CovEvery, c.InvEvery = 2, 3 })(t, p), nil
	}
	for _, v := range []struct {
		name   string
		mk     func(p *problem) (optim.Optimizer, error)
		want   []int // phases of steps 1..12
		shapes [][]int
	}{
		// start 3, every 4
		{"shampoo", shampoo(false, 0), []int{-1, 0, -1, 1, 1, 1, -1, 1, 1, 1, -1, 1}, nil},
		{"shampoo-async-2", shampoo(true, 2), []int{-1, 0, -1, 0, -1, 1, -1, 1, -1, 1, -1, 1}, nil},
		// start 1, every 4
		{"soap", soap(false, 0), []int{-1, 1, 1, 1, -1, 1, 1, 1, -1, 1, 1, 1}, nil},
		{"soap-async-2", soap(true, 2), []int{-1, 0, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1}, nil},
		// inverses from 1 every 3, factors every 2 (the first at 2
		// overwrites them): +2 when the static layers' factors are due
		{"kfac", kfac, []int{-1, -1, 1, -1, 1, 3, -1, 3, 1, -1, 1, 3}, kfacShapes},
	} {
		shapes := v.shapes
		if shapes == nil {
			shapes = groupShapes
		}
		run := func(replay bool) ([][]float64, []int) {
			p := hostProblem(t, shapes...)
			r := rand.New(rand.NewPCG(seed, 6))
			p.set(draws(r, 1, shapes))
			o, err := v.mk(p)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Free()
			ph := o.(optim.Phaser)
			scale := opstest.Empty(t, p.a, tensor.F32, 1)
			if sc, ok := o.(interface{ SetLRScale(*tensor.Tensor) }); ok {
				sc.SetLRScale(scale)
			}
			var phases []int
			captured := map[int]int{} // phase → the step it was captured at
			for step := 1; step <= len(v.want); step++ {
				p.grads(draws(r, 1, shapes))
				if err := scale.WriteFloat32([]float32{1 / float32(step)}); err != nil {
					t.Fatal(err)
				}
				n := ph.NextPhase()
				phases = append(phases, n)
				at, ok := captured[n]
				switch {
				case replay && n >= 0 && ok:
					if err := optim.StepAsReplay(o, p.e, at); err != nil {
						t.Fatal(err)
					}
					ph.Replayed()
				default:
					if n >= 0 {
						captured[n] = step
					}
					if err := o.Step(p.e); err != nil {
						t.Fatal(err)
					}
				}
				if got := o.(optim.Stepper).Steps(); got != step {
					t.Fatalf("%s: after step %d the optimizer counts %d", v.name, step, got)
				}
				// The device's counter (checkpointed; dropout keys on it)
				// advances in replays too.
				b, err := o.(interface{ Counter() *tensor.Tensor }).Counter().Read()
				if err != nil {
					t.Fatal(err)
				}
				if got := tensor.BytesAs[int32](b)[0]; int(got) != step {
					t.Fatalf("%s: after step %d (replay %v) the device counter is %d", v.name, step, replay, got)
				}
			}
			return p.values(), phases
		}
		eager, phases := run(false)
		replayed, _ := run(true)
		for i := range v.want {
			if phases[i] != v.want[i] {
				t.Fatalf("%s: phases %v, want %v", v.name, phases, v.want)
			}
		}
		sameBits(t, v.name+": replayed vs eager", replayed, eager)
	}
}

// TestKFACComputePhase: the phase of the forward and backward whose
// OnLinear hook captures K-FAC's factors: −1 before the step count is
// known and at the first factor update (it overwrites the factors), 1
// when factors are due, 0 when not.
func TestKFACComputePhase(t *testing.T) {
	p := hostProblem(t, kfacShapes...)
	o := kfacMaker(func(c *optim.KFACConfig) { c.CovEvery, c.InvEvery = 2, 3 })(t, p).(*optim.KFAC)
	defer o.Free()
	want := []int{-1, -1, 0, 1, 0, 1, 0, 1}
	var got []int
	for range want {
		got = append(got, o.ComputePhase())
		if err := o.Step(p.e); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("compute phases %v, want %v", got, want)
	}
}
