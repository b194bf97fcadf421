package optim_test

import (
	"errors"
	"testing"

	"gpukit/libgpu/optim"
)

// TestSpecBuildsEvery: Defaults and New build every named optimizer, which
// steps; unknown names and root methods are ErrConfig.
func TestSpecBuildsEvery(t *testing.T) {
	for _, name := range optim.Names {
		s, err := optim.Defaults(name)
		if err != nil {
			t.Fatal(err)
		}
		s.Root, s.Async, s.MaxStaleness = "newton", true, 1
		p := hostProblem(t, []int{6, 4}, []int{6})
		p.set(draws(newRand(1), 1, p.shapes))
		o, err := optim.New(p.a, "run", p.params, []optim.KFACLayer{{Weight: p.params[0].Name}}, s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i := 0; i < 3; i++ {
			p.grads(draws(newRand(uint64(i)), 1, p.shapes))
			if err := o.Step(p.e); err != nil {
				t.Fatalf("%s: step: %v", name, err)
			}
		}
		o.Free()
	}
	if _, err := optim.Defaults("lion"); !errors.Is(err, optim.ErrConfig) {
		t.Errorf("unknown name: %v", err)
	}
	s, _ := optim.Defaults("shampoo")
	s.Root = "cholesky"
	p := hostProblem(t, []int{2, 2})
	if _, err := optim.New(p.a, "run", p.params, nil, s); !errors.Is(err, optim.ErrConfig) {
		t.Errorf("unknown root: %v", err)
	}
}
