package optim_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
)

// TestSpecCheckNamesTheField (issue 22, item 7): settings out of range are
// refused by New with ErrConfig naming the setting, for every algorithm,
// before any state is allocated; every algorithm's defaults pass.
func TestSpecCheckNamesTheField(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	cases := []struct {
		name, field string
		set         func(*optim.Spec)
	}{
		{"adamw", "lr", func(s *optim.Spec) { s.LR = nan }},
		{"adamw", "lr", func(s *optim.Spec) { s.LR = -1 }},
		{"adamw", "lr", func(s *optim.Spec) { s.LR = inf }},
		{"adamw", "beta1", func(s *optim.Spec) { s.Beta1 = 1.5 }},
		{"adamw", "beta2", func(s *optim.Spec) { s.Beta2 = 1 }},
		{"adamw", "eps", func(s *optim.Spec) { s.Eps = 0 }},
		{"adamw", "weight_decay", func(s *optim.Spec) { s.WeightDecay = -0.1 }},
		{"sgd", "momentum", func(s *optim.Spec) { s.Momentum = 1 }},
		{"sgd", "lr", func(s *optim.Spec) { s.LR = nan }},
		{"shampoo", "max_block", func(s *optim.Spec) { s.MaxBlock = optim.MaxOrder + 1 }},
		{"shampoo", "max_block", func(s *optim.Spec) { s.MaxBlock = 0 }},
		{"shampoo", "graft", func(s *optim.Spec) { s.Graft = "sgd" }},
		{"shampoo", "update_freq", func(s *optim.Spec) { s.UpdateFreq = 0 }},
		{"shampoo", "beta1", func(s *optim.Spec) { s.Beta1 = nan }},
		{"soap", "max_block", func(s *optim.Spec) { s.MaxBlock = 1 << 30 }},
		{"soap", "eps", func(s *optim.Spec) { s.Eps = -1 }},
		{"muon", "adam_lr", func(s *optim.Spec) { s.AdamLR = nan }},
		{"muon", "momentum", func(s *optim.Spec) { s.Momentum = 2 }},
		{"kfac", "damping", func(s *optim.Spec) { s.Damping = 0 }},
		{"kfac", "stat_decay", func(s *optim.Spec) { s.StatDecay = 1 }},
		{"kfac", "cov_every", func(s *optim.Spec) { s.CovEvery = -3 }},
		{"kfac", "root", func(s *optim.Spec) { s.Root = "cholesky" }},
		{"kfac", "max_staleness", func(s *optim.Spec) { s.MaxStaleness = 5 }},
		{"", "name", func(s *optim.Spec) { s.Name = "" }},
	}
	for _, c := range cases {
		name := c.name
		if name == "" {
			name = "adamw"
		}
		s, err := optim.Defaults(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Check(); err != nil {
			t.Fatalf("%s defaults: %v", name, err)
		}
		c.set(&s)
		p := hostProblem(t, []int{4, 3})
		_, err = optim.New(p.a, "run", p.params, nil, s)
		if !errors.Is(err, optim.ErrConfig) || !strings.Contains(err.Error(), ": "+c.field+" ") {
			t.Errorf("%s with a bad %s: %v", name, c.field, err)
		}
	}
}

// TestParamsChecked (issue 22, item 7): parameters that no step could use
// are refused when the optimizer is built, naming the parameter: bf16 or
// i32 values, a gradient of another shape or dtype, an empty or repeated
// name, no elements.
func TestParamsChecked(t *testing.T) {
	p := hostProblem(t, []int{4, 3})
	a := p.a
	mk := func(dt tensor.DType, shape ...int) *tensor.Tensor { return opstest.Empty(t, a, dt, shape...) }
	good := func() nn.Param { return nn.Param{Name: "w", Value: mk(tensor.F32, 4, 3), Grad: mk(tensor.F32, 4, 3)} }
	cases := map[string][]nn.Param{
		"bf16 value":     {{Name: "w", Value: mk(tensor.BF16, 4, 3), Grad: mk(tensor.F32, 4, 3)}},
		"i32 value":      {{Name: "w", Value: mk(tensor.I32, 4, 3), Grad: mk(tensor.I32, 4, 3)}},
		"shape mismatch": {{Name: "w", Value: mk(tensor.F32, 4, 3), Grad: mk(tensor.F32, 3, 4)}},
		"empty name":     {{Name: "", Value: mk(tensor.F32, 4, 3), Grad: mk(tensor.F32, 4, 3)}},
		"twice":          {good(), good()},
		"no elements":    {{Name: "w", Value: mk(tensor.F32, 0, 3), Grad: mk(tensor.F32, 0, 3)}},
	}
	for what, params := range cases {
		for _, name := range optim.Names {
			s, _ := optim.Defaults(name)
			o, err := optim.New(a, "run", params, nil, s)
			if !errors.Is(err, optim.ErrParams) {
				t.Errorf("%s, %s: %v", what, name, err)
			}
			if o != nil {
				o.Free()
			}
		}
	}
	// A scalar parameter is one element: every optimizer takes it.
	for _, name := range optim.Names {
		s, _ := optim.Defaults(name)
		o, err := optim.New(a, "run", []nn.Param{{Name: "temperature", Value: mk(tensor.F32), Grad: mk(tensor.F32)}}, nil, s)
		if err != nil {
			t.Fatalf("%s over a scalar: %v", name, err)
		}
		if err := o.Step(p.e); err != nil {
			t.Fatalf("%s over a scalar: step: %v", name, err)
		}
		o.Free()
	}
}

// TestKFACLayerChecked (issue 22, item 7): a K-FAC layer whose input or
// output-gradient buffer does not match its weight's width, or whose
// factors would pass MaxOrder, is refused when K-FAC is built.
func TestKFACLayerChecked(t *testing.T) {
	p := hostProblem(t, []int{5, 3}, []int{5})
	a := p.a
	p.params[0].Name, p.params[1].Name = "fc.weight", "fc.bias"
	s, _ := optim.Defaults("kfac")
	mk := func(shape ...int) *tensor.Tensor { return opstest.Empty(t, a, tensor.F32, shape...) }
	cases := map[string]optim.KFACLayer{
		"input width":       {Weight: "fc.weight", Bias: "fc.bias", Input: mk(8, 4), OutGrad: mk(8, 5)},
		"output width":      {Weight: "fc.weight", Bias: "fc.bias", Input: mk(8, 3), OutGrad: mk(8, 6)},
		"rows":              {Weight: "fc.weight", Bias: "fc.bias", Input: mk(8, 3), OutGrad: mk(7, 5)},
		"input, no outgrad": {Weight: "fc.weight", Bias: "fc.bias", Input: mk(8, 3)},
		"rank 3 input":      {Weight: "fc.weight", Bias: "fc.bias", Input: mk(2, 4, 3), OutGrad: mk(8, 5)},
	}
	for what, l := range cases {
		if _, err := optim.New(a, "run", p.params, []optim.KFACLayer{l}, s); !errors.Is(err, optim.ErrParams) || !strings.Contains(err.Error(), "fc.weight") {
			t.Errorf("%s: %v", what, err)
		}
	}
	o, err := optim.New(a, "run", p.params, []optim.KFACLayer{{Weight: "fc.weight", Bias: "fc.bias", Input: mk(8, 3), OutGrad: mk(8, 5)}}, s)
	if err != nil {
		t.Fatalf("a layer of the right widths: %v", err)
	}
	o.Free()
	// A weight wider than MaxOrder: refused before its factor is sized.
	wide := []nn.Param{{Name: "wide.weight", Value: mk(1, optim.MaxOrder+1), Grad: mk(1, optim.MaxOrder+1)}}
	if _, err := optim.New(a, "run", wide, []optim.KFACLayer{{Weight: "wide.weight"}}, s); !errors.Is(err, optim.ErrParams) || !strings.Contains(err.Error(), "order") {
		t.Errorf("a factor past MaxOrder: %v", err)
	}
}
