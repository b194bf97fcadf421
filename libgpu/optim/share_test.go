package optim_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"gpukit/libgpu/nccl/nccltest"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
)

// shareCases are optimizers whose refreshes ShareRoots splits: stacked
// blocks of several orders (Shampoo, SOAP; groupShapes at MaxBlock 3 give
// classes of 2 to 9 blocks) and whole jobs (K-FAC's two layers, so a third
// rank has none).
func shareCases() []struct {
	name   string
	shapes [][]int
	mk     maker
} {
	shampoo := func(mod func(c *optim.ShampooConfig)) maker {
		return func(t testing.TB, p *problem) optim.Optimizer {
			cfg := testShampooConfig()
			mod(&cfg)
			o, err := optim.NewShampoo(p.a, "run", p.params, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
	}
	return []struct {
		name   string
		shapes [][]int
		mk     maker
	}{
		{"shampoo/sync", groupShapes, shampoo(func(*optim.ShampooConfig) {})},
		{"shampoo/newton-async-stale1", groupShapes, shampoo(func(c *optim.ShampooConfig) {
			c.Roots.Method, c.Roots.Async, c.Roots.MaxStaleness = ops.RootNewton, true, 1
		})},
		{"shampoo/async-stale0", groupShapes, shampoo(func(c *optim.ShampooConfig) { c.Roots.Async = true })},
		{"soap/async-stale2", [][]int{{6, 6}, {4}, {7, 5}, {3, 3}, {2, 6}}, soapMaker(func(c *optim.SOAPConfig) {
			c.Roots.Async, c.Roots.MaxStaleness = true, 2
		})},
		{"soap/sync", [][]int{{6, 6}, {4}, {7, 5}, {3, 3}, {2, 6}}, soapMaker(func(*optim.SOAPConfig) {})},
		{"kfac/async-stale1", kfacShapes, kfacMaker(func(c *optim.KFACConfig) { c.Roots.Async, c.Roots.MaxStaleness = true, 1 })},
		{"kfac/sync", kfacShapes, kfacMaker(func(*optim.KFACConfig) {})},
	}
}

// sharedRun runs steps of mk's optimizer from seeded parameters and
// gradients (as runSteps), sharing its refreshes over c when c is not
// nil, and returns the parameters and the matrices it refreshed.
func sharedRun(t *testing.T, shapes [][]int, seed uint64, steps int, mk maker, c *nccltest.Comm) ([][]float64, int, error) {
	p := hostProblem(t, shapes...)
	r := rand.New(rand.NewPCG(seed, 1))
	p.set(draws(r, 1, shapes))
	o := mk(t, p)
	defer o.Free()
	if c != nil {
		ok, err := optim.ShareRoots(o, c)
		if err != nil || !ok {
			return nil, 0, fmt.Errorf("ShareRoots: %v, %v", ok, err)
		}
	}
	for i := 0; i < steps; i++ {
		p.grads(draws(r, 1, shapes))
		if err := o.Step(p.e); err != nil {
			return nil, 0, err
		}
	}
	st := o.(interface{ RootStats() optim.RootStats }).RootStats()
	return p.values(), st.Blocks, nil
}

// TestShareRoots: refreshes shared over 2 and 3 ranks (nccltest's
// in-process stand-in of NCCL) leave every rank bitwise the parameters of
// one process that computes every refresh — synchronous and asynchronous
// refreshes, any staleness, Newton and eigendecomposition roots, SOAP's
// eigenbases and K-FAC's layers — while each rank computes only its share
// of the matrices and the ranks together compute each once.
func TestShareRoots(t *testing.T) {
	seed := opstest.TestSeed(t)
	const steps = 9
	for _, tc := range shareCases() {
		t.Run(tc.name, func(t *testing.T) {
			want, total, err := sharedRun(t, tc.shapes, seed, steps, tc.mk, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{2, 3} {
				got := make([][][]float64, n)
				blocks := make([]int, n)
				var mu sync.Mutex
				err := nccltest.Run(n, func(c *nccltest.Comm) error {
					v, b, err := sharedRun(t, tc.shapes, seed, steps, tc.mk, c)
					mu.Lock()
					got[c.Rank()], blocks[c.Rank()] = v, b
					mu.Unlock()
					return err
				})
				if err != nil {
					t.Fatalf("%d ranks: %v", n, err)
				}
				sum := 0
				for q := range n {
					sameBits(t, fmt.Sprintf("%d ranks, rank %d against one process", n, q), got[q], want)
					sum += blocks[q]
					if blocks[q] >= total {
						t.Errorf("%d ranks: rank %d computed %d matrices, one process %d: not shared", n, q, blocks[q], total)
					}
				}
				if sum != total {
					t.Errorf("%d ranks computed %v matrices (%d in all), one process %d", n, blocks, sum, total)
				}
			}
		})
	}
}

// TestShareRootsRefused: sharing after the first step is refused (the
// refreshes' graphs and staged statuses are made for one split), and an
// optimizer without refreshes or a world of one rank is left alone.
func TestShareRootsRefused(t *testing.T) {
	err := nccltest.Run(1, func(c *nccltest.Comm) error {
		p := hostProblem(t, shampooShapes...)
		o, err := optim.NewShampoo(p.a, "run", p.params, testShampooConfig())
		if err != nil {
			return err
		}
		defer o.Free()
		if ok, err := optim.ShareRoots(o, c); ok || err != nil {
			return fmt.Errorf("one rank: shared %v, %v", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = nccltest.Run(2, func(c *nccltest.Comm) error {
		p := hostProblem(t, shampooShapes...)
		p.set(draws(newRand(1), 1, shampooShapes))
		o, err := optim.NewShampoo(p.a, "run", p.params, testShampooConfig())
		if err != nil {
			return err
		}
		defer o.Free()
		p.grads(draws(newRand(2), 1, shampooShapes))
		if err := o.Step(p.e); err != nil {
			return err
		}
		if ok, err := optim.ShareRoots(o, c); err == nil {
			return fmt.Errorf("shared after a step: %v, no error", ok)
		}
		adam, err := optim.NewAdamW(p.a, "run2", p.params, ops.DefaultAdamW)
		if err != nil {
			return err
		}
		defer adam.Free()
		if ok, err := optim.ShareRoots(adam, c); ok || err != nil {
			return fmt.Errorf("AdamW: shared %v, %v", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
