package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "adamatan2", Check: checkAdamATan2}) }

// AdamATan2Ref applies Adam-atan2 step t (1-based) in place in float64,
// as the adam-atan2 package's reference implementation writes it
// (adam_atan2_test.py _adam_atan2_reference_impl: param.mul_(1 − lr·wd);
// exp_avg.lerp_(grad, 1 − β1); exp_avg_sq.mul_(β2).addcmul_(grad, grad,
// 1 − β2); denom = √exp_avg_sq/√bc2; param −= (lr/bc1)·atan2(exp_avg,
// denom)), with the paper's a, b (0: 1) and, for BiasInside, m/bc1 inside
// the atan2. lr is the learning rate in effect (schedule applied); wd the
// parameter's weight decay.
func AdamATan2Ref(p, g, m, v []float64, t int, lr, wd float64, cfg ops.AdamATan2Config) {
	adamATan2(p, g, m, v, nil, nil, t, lr, wd, cfg)
}

// AdamATan2TermsRef is AdamATan2Ref advancing, with the same step, the
// terms' sizes tp of p and tm of m (TermsErr): m + (1−β1)(g − m) sums m
// and (1−β1)·(|g| + |m|);
// p sums (1−lr·wd)·p and the step, whose size is at most a·lr·π/2
// (divided by 1−β1ᵗ outside), whatever the rounding of m and v near
// atan2's (0, 0). v sums squares: its terms are itself.
func AdamATan2TermsRef(p, g, m, v, tp, tm []float64, t int, lr, wd float64, cfg ops.AdamATan2Config) {
	adamATan2(p, g, m, v, tp, tm, t, lr, wd, cfg)
}

func adamATan2(p, g, m, v, tp, tm []float64, t int, lr, wd float64, cfg ops.AdamATan2Config) {
	b1, b2 := float64(cfg.Beta1), float64(cfg.Beta2)
	a, b := float64(cfg.A), float64(cfg.B)
	if a == 0 {
		a = 1
	}
	if b == 0 {
		b = 1
	}
	bc1 := 1 - math.Pow(b1, float64(t))
	bc2 := 1 - math.Pow(b2, float64(t))
	for i := range p {
		if tp != nil {
			tm[i] += (1 - b1) * (math.Abs(g[i]) + tm[i]) // m + (1−β1)(g − m)
			step := a * lr * math.Pi / 2
			if !cfg.BiasInside {
				step /= bc1
			}
			tp[i] = math.Abs(1-lr*wd)*tp[i] + step
		}
		p[i] *= 1 - lr*wd
		m[i] += (1 - b1) * (g[i] - m[i])
		v[i] = b2*v[i] + (1-b2)*g[i]*g[i]
		den := b * math.Sqrt(v[i]) / math.Sqrt(bc2)
		if cfg.BiasInside {
			p[i] -= a * lr * math.Atan2(m[i]/bc1, den)
		} else {
			p[i] -= a * lr / bc1 * math.Atan2(m[i], den)
		}
	}
}

// SignSGDRef applies one sign-SGD step in place: p ← p(1 − lr·wd) −
// lr·sign(g), sign(0) = 0 (HRM's _sparse_emb_signsgd_dist on the rows it
// updates).
func SignSGDRef(p, g []float64, lr, wd float64) {
	for i := range p {
		s := 0.0
		if g[i] > 0 {
			s = 1
		} else if g[i] < 0 {
			s = -1
		}
		p[i] = p[i]*(1-lr*wd) - lr*s
	}
}

var aa2Shapes = [][]int{{5, 3}, {7}, {1}, {17, 9}, {3000}}

func checkAdamATan2(s *Suite) {
	s.Run("steps", aa2Steps)
	s.Run("package-parity", aa2Parity)
	s.Run("signsgd", signSGDSteps)
	s.Run("validation", aa2Validation)
}

// aa2Grads draws gradients with about one element in eight exactly zero
// (atan2(0, 0) = 0: no update but the decay on a first step).
func aa2Grads(s *Suite, n int, scale float64) []float64 {
	g := make([]float64, n)
	for i := range g {
		if s.R.IntN(8) != 0 {
			g[i] = float64(float32(scale * s.R.NormFloat64()))
		}
	}
	return g
}

// aa2Steps runs five steps of several configurations (the package's
// defaults, HRM's betas and weight decay, the paper's a and m̂ inside, a
// schedule through LRScale with NoDecay, clipping through GradScale) from
// step 0 and from a resumed step 41 with non-zero moments, against
// AdamATan2Ref: parameters, moments and the step counter.
func aa2Steps(s *Suite) {
	sched := s.Const(tensor.F32, []float64{1}, 1)
	gscale := s.Const(tensor.F32, []float64{0.37}, 1)
	cfgs := []ops.AdamATan2Config{
		ops.DefaultAdamATan2,
		{LR: 2e-2, Beta1: 0.9, Beta2: 0.95, WeightDecay: 1},
		{LR: 1e-2, Beta1: 0.8, Beta2: 0.99, WeightDecay: 0.1, A: 1.27, B: 1, BiasInside: true},
		{LR: 3e-2, Beta1: 0.9, Beta2: 0.95, WeightDecay: 0.5, LRScale: sched, NoDecay: []bool{false, true, true, false, false}},
		{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, WeightDecay: 0.1, B: 2, GradScale: gscale},
	}
	for ci, cfg := range cfgs {
		for _, start := range []int32{0, 41} {
			s.Run(fmt.Sprintf("config=%d/start=%d", ci, start), func(s *Suite) {
				var ps, gs, ms, vs []*tensor.Tensor
				var pf, mf, vf, tpf, tmf [][]float64 // tpf, tmf: the terms' sizes of p and m
				for _, sh := range aa2Shapes {
					p, f := s.Rand(tensor.F32, 1, sh...)
					ps, pf, tpf = append(ps, p), append(pf, f), append(tpf, Abs(f))
					gs = append(gs, s.Empty(tensor.F32, sh...))
					n := tensor.Numel(sh)
					mv, vv := make([]float64, n), make([]float64, n)
					if start > 0 {
						for i := range mv {
							mv[i] = float64(float32(0.1 * s.R.NormFloat64()))
							vv[i] = float64(float32(0.01 * s.R.Float64()))
						}
					}
					ms, mf = append(ms, s.Const(tensor.F32, mv, sh...)), append(mf, mv)
					vs, vf = append(vs, s.Const(tensor.F32, vv, sh...)), append(vf, vv)
					tmf = append(tmf, Abs(mv))
				}
				step := UploadI32(s.T, s.A, []int32{start}, 1)
				for k := 1; k <= 5; k++ {
					lr := float64(cfg.LR)
					if cfg.LRScale != nil {
						sc := float32(0.5 + 0.25*float64(k))
						s.NoErr("schedule", cfg.LRScale.WriteF32([]float32{sc}))
						lr = float64(cfg.LR * sc)
					}
					for i, g := range gs {
						gv := aa2Grads(s, g.Numel(), 1)
						s.NoErr("grad", g.WriteFloat32(F32(gv)))
						if cfg.GradScale != nil {
							for j := range gv {
								gv[j] = float64(float32(gv[j]) * 0.37)
							}
						}
						wd := float64(cfg.WeightDecay)
						if cfg.NoDecay != nil && cfg.NoDecay[i] {
							wd = 0
						}
						AdamATan2TermsRef(pf[i], gv, mf[i], vf[i], tpf[i], tmf[i], int(start)+k, lr, wd, cfg)
					}
					s.NoErr("adamatan2", s.E.AdamATan2(ps, gs, ms, vs, step, cfg))
					for i := range ps {
						s.Close(fmt.Sprintf("step %d param %d", k, i), s.Read(ps[i]), pf[i], tpf[i], 1e-5)
						s.Close(fmt.Sprintf("step %d m %d", k, i), s.Read(ms[i]), mf[i], tmf[i], 1e-5)
						s.Close(fmt.Sprintf("step %d v %d", k, i), s.Read(vs[i]), vf[i], nil, 1e-5)
					}
					if got := DownloadI32(s.T, step)[0]; got != start+int32(k) {
						s.T.Fatalf("step counter %d, want %d", got, start+int32(k))
					}
				}
			})
		}
	}
}

// aa2Parity is the adam-atan2 package's own test (adam_atan2_test.py
// test_adam_atan2_backend) at f32: parameters from N(0, 0.02²), 100 steps
// of gradients from N(0, 0.001²), betas (0.9, 0.95), weight decay 0.1,
// every shape and lr of its grid that is small enough here, and its f32
// tolerance, 1e-6 absolute on parameters and moments, against the
// float64 reference.
func aa2Parity(s *Suite) {
	for _, sh := range [][]int{{1}, {4096}, {96, 130}} {
		for _, lr := range []float32{1e-3, 1e-4, 5e-4} {
			cfg := ops.AdamATan2Config{LR: lr, Beta1: 0.9, Beta2: 0.95, WeightDecay: 0.1}
			n := tensor.Numel(sh)
			p, pf := s.Rand(tensor.F32, 0.02, sh...)
			m, v := s.Const(tensor.F32, make([]float64, n), sh...), s.Const(tensor.F32, make([]float64, n), sh...)
			mf, vf := make([]float64, n), make([]float64, n)
			g := s.Empty(tensor.F32, sh...)
			step := UploadI32(s.T, s.A, []int32{0}, 1)
			for k := 1; k <= 100; k++ {
				gv := make([]float64, n)
				for i := range gv {
					gv[i] = float64(float32(0.001 * s.R.NormFloat64()))
				}
				s.NoErr("grad", g.WriteFloat32(F32(gv)))
				AdamATan2Ref(pf, gv, mf, vf, k, float64(lr), 0.1, cfg)
				s.NoErr("adamatan2", s.E.AdamATan2([]*tensor.Tensor{p}, []*tensor.Tensor{g}, []*tensor.Tensor{m}, []*tensor.Tensor{v}, step, cfg))
			}
			for _, c := range []struct {
				what string
				t    *tensor.Tensor
				want []float64
			}{{"param", p, pf}, {"exp_avg", m, mf}, {"exp_avg_sq", v, vf}} {
				got := s.Read(c.t)
				var worst float64
				for i := range got {
					worst = max(worst, math.Abs(got[i]-c.want[i]))
				}
				if !(worst <= 1e-6) {
					s.T.Errorf("%v lr=%g: %s differs from the package's formula by %.3g (> 1e-6)", sh, lr, c.what, worst)
				}
			}
			if got := DownloadI32(s.T, step)[0]; got != 100 {
				s.T.Errorf("step counter %d, want 100", got)
			}
		}
	}
}

// signSGDSteps: five steps, with and without a schedule, zero gradients
// giving the decay alone.
func signSGDSteps(s *Suite) {
	sched := s.Const(tensor.F32, []float64{1}, 1)
	for ci, cfg := range []ops.SignSGDConfig{{LR: 1e-2, WeightDecay: 0.1}, {LR: 3e-3, WeightDecay: 1, LRScale: sched}, {LR: 0.5}} {
		var ps, gs []*tensor.Tensor
		var pf, tf [][]float64 // the parameters and the terms they sum: |p₀| + Σ lr·(1 + wd·|p|)
		for _, sh := range aa2Shapes {
			p, f := s.Rand(tensor.F32, 1, sh...)
			ps, pf = append(ps, p), append(pf, f)
			tf = append(tf, Abs(f))
			gs = append(gs, s.Empty(tensor.F32, sh...))
		}
		for k := 1; k <= 5; k++ {
			lr := float64(cfg.LR)
			if cfg.LRScale != nil {
				sc := float32(0.25 * float64(k))
				s.NoErr("schedule", cfg.LRScale.WriteF32([]float32{sc}))
				lr = float64(cfg.LR * sc)
			}
			for i, g := range gs {
				gv := aa2Grads(s, g.Numel(), 1)
				s.NoErr("grad", g.WriteFloat32(F32(gv)))
				for j := range tf[i] {
					tf[i][j] += lr * (1 + float64(cfg.WeightDecay)*math.Abs(pf[i][j]))
				}
				SignSGDRef(pf[i], gv, lr, float64(cfg.WeightDecay))
			}
			s.NoErr("signsgd", s.E.SignSGD(ps, gs, cfg))
			// Relative to the terms: a parameter the steps bring near zero
			// (lr 0.5 against N(0, 1) values) carries the rounding of its
			// larger terms (seen: 1.8e-6 of such a value).
			for i := range ps {
				s.Close(fmt.Sprintf("config %d step %d param %d", ci, k, i), s.Read(ps[i]), pf[i], tf[i], 1e-6)
			}
		}
	}
}

func aa2Validation(s *Suite) {
	f := func(shape ...int) *tensor.Tensor { return s.Empty(tensor.F32, shape...) }
	ts := func(t ...*tensor.Tensor) []*tensor.Tensor { return t }
	w, step := f(5, 3), UploadI32(s.T, s.A, []int32{0}, 1)
	cfg := ops.DefaultAdamATan2
	bad := func(c ops.AdamATan2Config, mod func(*ops.AdamATan2Config)) ops.AdamATan2Config { mod(&c); return c }
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"count", s.E.AdamATan2(ts(w), ts(f(5, 3)), ts(f(5, 3)), nil, step, cfg), tensor.ErrShape},
		{"grad shape", s.E.AdamATan2(ts(w), ts(f(3, 5)), ts(f(5, 3)), ts(f(5, 3)), step, cfg), tensor.ErrShape},
		{"step dtype", s.E.AdamATan2(ts(w), ts(f(5, 3)), ts(f(5, 3)), ts(f(5, 3)), f(1), cfg), tensor.ErrDType},
		{"no step", s.E.AdamATan2(ts(w), ts(f(5, 3)), ts(f(5, 3)), ts(f(5, 3)), nil, cfg), tensor.ErrShape},
		{"beta2 = 1", s.E.AdamATan2(ts(w), ts(f(5, 3)), ts(f(5, 3)), ts(f(5, 3)), step, bad(cfg, func(c *ops.AdamATan2Config) { c.Beta2 = 1 })), ops.ErrConfig},
		{"negative a", s.E.AdamATan2(ts(w), ts(f(5, 3)), ts(f(5, 3)), ts(f(5, 3)), step, bad(cfg, func(c *ops.AdamATan2Config) { c.A = -1 })), ops.ErrConfig},
		{"NoDecay length", s.E.AdamATan2(ts(w), ts(f(5, 3)), ts(f(5, 3)), ts(f(5, 3)), step, bad(cfg, func(c *ops.AdamATan2Config) { c.NoDecay = []bool{true, false} })), ops.ErrConfig},
		{"LRScale shape", s.E.AdamATan2(ts(w), ts(f(5, 3)), ts(f(5, 3)), ts(f(5, 3)), step, bad(cfg, func(c *ops.AdamATan2Config) { c.LRScale = f(2) })), tensor.ErrShape},
		{"bf16 param", s.E.AdamATan2(ts(s.Empty(tensor.BF16, 5, 3)), ts(f(5, 3)), ts(f(5, 3)), ts(f(5, 3)), step, cfg), tensor.ErrDType},
		{"signsgd grad shape", s.E.SignSGD(ts(w), ts(f(3, 5)), ops.SignSGDConfig{LR: 1}), tensor.ErrShape},
		{"signsgd negative lr", s.E.SignSGD(ts(w), ts(f(5, 3)), ops.SignSGDConfig{LR: -1}), ops.ErrConfig},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			s.T.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if got := DownloadI32(s.T, step)[0]; got != 0 {
		t := s.T
		t.Errorf("a rejected call advanced the step counter to %d", got)
	}
}
