package ops

// The diffusion family: what a diffusion model's training step and sampling
// loop do besides the network (libgpu/kernels/diffusion.cu) —
//
//   - GaussianNoise: standard normal draws from a counter-based generator
//     (Philox4x32-10, the dropout family's, with the Box–Muller transform);
//   - QSample: the forward process x_t = √ᾱ_t·x0 + √(1−ᾱ_t)·ε with ε drawn
//     in the same pass (Ho et al. 2020, eq. 4), the ε-prediction target;
//   - DiffusionStart and DiffusionStep: the sampling loop's start (x_T from
//     noise, or a frame re-noised) and its fused per-step update — the
//     classifier-free guidance combine (Ho & Salimans 2022), the data
//     prediction x̂0 with clipping and temporal blending, and one update
//     rule that covers DDPM (Ho et al. 2020), DDIM with η (Song et al.
//     2021) and DPM-Solver++ 2M (Lu et al. 2022) through per-step
//     coefficients kept in device memory (libgpu/diffusion computes them);
//   - EMA: an exponential moving average of weights.
//
// Every draw is a function of (seed, stream, step, element) only, so the
// host and CUDA backends, eager runs and replayed graphs draw the same
// noise; step is read on the device from a counter tensor when the op
// runs, so a captured graph draws new noise each time the counter moves.
// Reference and checks: opstest/diffusion.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// NormalAt is the standard normal draw for element i of the noise stream
// (seed, stream, step): group q = i/4 takes the four Philox4x32-10 words
// of counter (q low, q high, stream, step) under key (seed low, seed high)
// and pairs them with the Box–Muller transform (u1 = ((r0>>8)+1)·2⁻²⁴,
// u2 = (r1>>8)·2⁻²⁴, z0 = √(−2 ln u1)·cos 2πu2, z1 = √(−2 ln u1)·sin 2πu2;
// z2, z3 from r2, r3); element i is z[i mod 4]. Computed in float64 and
// rounded: the CUDA kernels compute it in f32 and agree to a few ulps.
func NormalAt(seed uint64, stream, step uint32, i int64) float32 {
	var z [4]float32
	normal4(seed, stream, step, uint64(i)/4, &z)
	return z[i%4]
}

func normal4(seed uint64, stream, step uint32, q uint64, z *[4]float32) {
	r := Philox4x32([4]uint32{uint32(q), uint32(q >> 32), stream, step}, [2]uint32{uint32(seed), uint32(seed >> 32)})
	for k := 0; k < 4; k += 2 {
		u1 := float64((r[k]>>8)+1) / (1 << 24)
		u2 := float64(r[k+1]>>8) / (1 << 24)
		rad := math.Sqrt(-2 * math.Log(u1))
		sn, cs := math.Sincos(2 * math.Pi * u2)
		z[k], z[k+1] = float32(rad*cs), float32(rad*sn)
	}
}

// hostStep reads the i32 counter (nil: 0).
func hostStep(counter *tensor.Tensor) (uint32, error) {
	if counter == nil {
		return 0, nil
	}
	c, err := counter.I32()
	if err != nil {
		return 0, fmt.Errorf("ops: host backend: %w", err)
	}
	return uint32(c[0]), nil
}

func (e *Engine) checkCounter(what string, counter *tensor.Tensor) error {
	if counter == nil {
		return nil
	}
	if err := e.checkView(what, counter, true, []tensor.DType{tensor.I32}); err != nil {
		return err
	}
	if counter.Numel() != 1 {
		return fmt.Errorf("%w: %s %v, want one i32", tensor.ErrShape, what, counter.Shape)
	}
	return nil
}

// GaussianNoise fills out (contiguous, f32 or bf16) with standard normal
// draws: out[i] = NormalAt(seed, stream, step, i), step read from counter
// (an i32 scalar on the device; nil: 0) when the op runs. Errors wrap
// tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) GaussianNoise(out *tensor.Tensor, seed uint64, stream uint32, counter *tensor.Tensor) error {
	if err := e.checkView("noise out", out, true, floatTypes); err != nil {
		return err
	}
	if err := e.checkCounter("noise counter", counter); err != nil {
		return err
	}
	n := out.Numel()
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		step, err := hostStep(counter)
		if err != nil {
			return err
		}
		v := make([]float32, n)
		var z [4]float32
		for i := range v {
			if i%4 == 0 {
				normal4(seed, stream, step, uint64(i)/4, &z)
			}
			v[i] = z[i%4]
		}
		return out.WriteFloat32(v)
	}, func(c *cudaImpl) error {
		return launch.DiffNoise(c, dtName(out.DType), gridFor(int64((n+3)/4), 256), block1(256), 0,
			devPtr(out), int64(n), seed, stream, devPtr(counter))
	})
}

// QSample draws the forward process of a diffusion model at per-sample
// timesteps (Ho et al. 2020, eq. 4; the training input and target of
// ε-prediction):
//
//	eps[i] = NormalAt(seed, stream, step, i)
//	xt[i]  = sab[t[n]]·x0[i] + s1mab[t[n]]·eps[i]      (n = i / (elements per sample))
//
// x0, xt and eps [N, ...] contiguous of one shape, each f32 or bf16 (xt
// and eps of one dtype); t i32 [N], each in [0, T); sab and s1mab f32 [T]
// (√ᾱ_t and √(1−ᾱ_t)); step from counter as GaussianNoise. A timestep
// outside [0, T) is ErrLabel on the host; CUDA clamps it. Errors as
// GaussianNoise.
func (e *Engine) QSample(xt, eps, x0, t, sab, s1mab *tensor.Tensor, seed uint64, stream uint32, counter *tensor.Tensor) error {
	if err := e.rwCheckElem("qsample", false, x0, []string{"x0", "xt", "eps"}, xt, eps); err != nil {
		return err
	}
	if xt.DType != eps.DType {
		return fmt.Errorf("%w: qsample xt %v, eps %v", tensor.ErrDType, xt.DType, eps.DType)
	}
	if x0.Rank() < 1 {
		return fmt.Errorf("%w: qsample of a scalar", tensor.ErrShape)
	}
	n := x0.Dim(0)
	if err := e.checkView("qsample t", t, true, []tensor.DType{tensor.I32}, n); err != nil {
		return err
	}
	if err := e.checkView("qsample sqrt(alpha_bar)", sab, true, []tensor.DType{tensor.F32}); err != nil {
		return err
	}
	T := sab.Numel()
	if sab.Rank() != 1 || T < 1 {
		return fmt.Errorf("%w: qsample schedule %v", tensor.ErrShape, sab.Shape)
	}
	if err := e.checkView("qsample sqrt(1-alpha_bar)", s1mab, true, []tensor.DType{tensor.F32}, T); err != nil {
		return err
	}
	if err := e.checkCounter("qsample counter", counter); err != nil {
		return err
	}
	total := x0.Numel()
	if total == 0 {
		return nil
	}
	per := total / n
	return e.dispatch(func(*hostImpl) error {
		step, err := hostStep(counter)
		if err != nil {
			return err
		}
		ts, err := t.I32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		if err := checkIndices("qsample timestep", ts, T); err != nil {
			return err
		}
		a, err := sab.F32()
		if err != nil {
			return err
		}
		s, err := s1mab.F32()
		if err != nil {
			return err
		}
		xs, err := hostIn(x0)
		if err != nil {
			return err
		}
		zs := make([]float32, total)
		out := make([]float32, total)
		var z [4]float32
		for i := range out {
			if i%4 == 0 {
				normal4(seed, stream, step, uint64(i)/4, &z)
			}
			zs[i] = z[i%4]
			k := ts[i/per]
			out[i] = a[k]*xs[i] + s[k]*zs[i]
		}
		if err := eps.WriteFloat32(zs); err != nil {
			return err
		}
		return xt.WriteFloat32(out)
	}, func(c *cudaImpl) error {
		return launch.DiffQsample(c, dtName(xt.DType)+dtSuffix(x0.DType), gridFor(int64((total+3)/4), 256), block1(256), 0,
			devPtr(xt), devPtr(eps), devPtr(x0), devPtr(t), devPtr(sab), devPtr(s1mab), int64(total), int64(per), int32(T),
			seed, stream, devPtr(counter))
	})
}

// The fields of a row of a sampling loop's coefficient table (f32
// [rows, CoefWidth] on the device; libgpu/diffusion fills it). Row 0 is
// the start (DiffusionStart): x = CoefA·x0 + CoefS·z, model input t =
// CoefTNext. Row i ≥ 1 is step i (DiffusionStep):
//
//	ε  = ε_u + CoefGuidance·(ε_c − ε_u)      (ε_c alone with one pass)
//	     where ε_u is the unconditional pass, or with one pass, a previous
//	     frame and CoefResidual ≠ 0, the residual noise (x − CoefA·prev)/CoefS
//	x̂0 = (x − CoefS·ε)/CoefA, clipped to [−1, 1] when CoefClip ≠ 0,
//	     then (1 − CoefBlend)·x̂0 + CoefBlend·prev with a previous frame
//	ε' = (x − CoefA·x̂0)/CoefS                 (ε consistent with x̂0)
//	x' = CoefX·x + CoefX0·x̂0 + CoefEps·ε' + CoefD·d + CoefSigma·z
//
// with d the previous step's x̂0 (DPM-Solver++ 2M's second-order term),
// z = NormalAt(seed, stream, step, i), and the model's next timestep
// CoefTNext (an integer, exact in f32).
const (
	CoefA        = 0  // √ᾱ_t (start: the weight of x0)
	CoefS        = 1  // √(1 − ᾱ_t) (start: the noise scale)
	CoefX        = 2  // weight of x_t
	CoefX0       = 3  // weight of the data prediction x̂0
	CoefEps      = 4  // weight of the noise prediction ε'
	CoefD        = 5  // weight of the previous step's x̂0
	CoefSigma    = 6  // standard deviation of the fresh noise
	CoefGuidance = 7  // classifier-free guidance scale
	CoefTNext    = 8  // the model's next timestep
	CoefBlend    = 9  // weight of the previous frame in x̂0 (video)
	CoefClip     = 10 // clip x̂0 to [−1, 1] when ≠ 0
	// CoefResidual ≠ 0 guides a one-pass step with a previous frame by
	// residual classifier-free guidance (R-CFG, the self-negative form of
	// StreamDiffusion, Kodaira et al. 2023, arXiv 2312.12491 §3.3): the
	// unconditional prediction is replaced by the noise that takes the
	// previous frame to x, ε̄ = (x − √ᾱ·prev)/√(1−ᾱ), so that before
	// clipping and blending x̂0 = prev + CoefGuidance·(x̂0_c − prev): the
	// conditional prediction pushed away from the frame it started from.
	CoefResidual = 11
	CoefWidth    = 12 // floats per row (48 bytes)
)

// DiffusionStep is one fused update of a sampling loop (see the Coef*
// fields), reading the model output once. Shapes: X [N, ...] f32 (the
// sample, updated in place), Eps [P·N, ...] of the model's dtype (P = 1,
// or 2 with guidance: conditional rows first, then unconditional), Coef
// f32 [rows, CoefWidth]; optional: D f32 of X's shape (the previous data
// prediction, read, then overwritten with this step's x̂0), XIn [P·N, ...]
// of any float dtype (the model's next input: x' in every pass), TIn i32
// [P·N] (the model's next timesteps), Prev f32 of X's shape (the previous
// frame, for CoefBlend), Counter (i32 scalar: the noise's step; nil 0).
// All contiguous. Row selects the coefficient row (≥ 1 for a step, 0 for
// DiffusionStart).
type DiffusionStep struct {
	X, D, Eps, XIn, TIn, Prev *tensor.Tensor
	Coef, Counter             *tensor.Tensor
	Row                       int
	Seed                      uint64
	Stream                    uint32
}

func (e *Engine) checkDiffStep(op string, s *DiffusionStep, needEps bool) (passes int, err error) {
	if err := e.checkView(op+" x", s.X, true, []tensor.DType{tensor.F32}); err != nil {
		return 0, err
	}
	if s.X.Rank() < 1 || s.X.Numel() == 0 {
		return 0, fmt.Errorf("%w: %s x %v", tensor.ErrShape, op, s.X.Shape)
	}
	n := s.X.Dim(0)
	inner := s.X.Shape[1:]
	passes = 1
	if needEps {
		if err := e.checkView(op+" eps", s.Eps, true, floatTypes); err != nil {
			return 0, err
		}
		if s.Eps.Rank() != s.X.Rank() || !tensor.SameShape(s.Eps.Shape[1:], inner) || (s.Eps.Dim(0) != n && s.Eps.Dim(0) != 2*n) {
			return 0, fmt.Errorf("%w: %s eps %v for x %v (want [N or 2N, ...])", tensor.ErrShape, op, s.Eps.Shape, s.X.Shape)
		}
		passes = s.Eps.Dim(0) / n
	}
	if s.XIn != nil {
		if err := e.checkView(op+" model input", s.XIn, true, floatTypes); err != nil {
			return 0, err
		}
		if s.XIn.Rank() != s.X.Rank() || !tensor.SameShape(s.XIn.Shape[1:], inner) || (s.XIn.Dim(0) != n && s.XIn.Dim(0) != 2*n) ||
			(needEps && s.XIn.Dim(0) != passes*n) {
			return 0, fmt.Errorf("%w: %s model input %v for x %v", tensor.ErrShape, op, s.XIn.Shape, s.X.Shape)
		}
		passes = s.XIn.Dim(0) / n
	}
	if s.TIn != nil {
		if err := e.checkView(op+" timesteps", s.TIn, true, []tensor.DType{tensor.I32}, passes*n); err != nil {
			return 0, err
		}
	}
	for _, p := range []struct {
		what string
		t    *tensor.Tensor
	}{{"d", s.D}, {"prev", s.Prev}} {
		if p.t != nil {
			if err := e.checkView(op+" "+p.what, p.t, true, []tensor.DType{tensor.F32}, s.X.Shape...); err != nil {
				return 0, err
			}
		}
	}
	if err := e.checkView(op+" coefficients", s.Coef, true, []tensor.DType{tensor.F32}); err != nil {
		return 0, err
	}
	if s.Coef.Rank() != 2 || s.Coef.Dim(1) != CoefWidth || s.Row < 0 || s.Row >= s.Coef.Dim(0) {
		return 0, fmt.Errorf("%w: %s row %d of coefficients %v (want [rows, %d])", tensor.ErrShape, op, s.Row, s.Coef.Shape, CoefWidth)
	}
	if err := e.checkCounter(op+" counter", s.Counter); err != nil {
		return 0, err
	}
	return passes, nil
}

func (s *DiffusionStep) args(passes int) launch.DiffArgs {
	n := s.X.Numel()
	p := devPtr
	return launch.DiffArgs{X: p(s.X), D: p(s.D), Eps: p(s.Eps), Xin: p(s.XIn), Tin: p(s.TIn), Prev: p(s.Prev),
		Coef: devPtr(s.Coef).Add(int64(s.Row * CoefWidth * 4)), Counter: p(s.Counter), Seed: s.Seed, N: int64(n),
		Per: int32(n / s.X.Dim(0)), Passes: int32(passes), Samples: int32(s.X.Dim(0)), Stream: s.Stream}
}

// DiffusionStart begins a sampling loop from row s.Row of the coefficient
// table: X = CoefA·Prev + CoefS·z (Prev nil: pure noise CoefS·z; a frame
// re-noised to a timestep: CoefA = √ᾱ_t, CoefS = √(1−ᾱ_t)), written also
// into every pass of XIn, and TIn = CoefTNext. Eps and D are not read.
// Errors as DiffusionStep.
func (e *Engine) DiffusionStart(s DiffusionStep) error {
	passes, err := e.checkDiffStep("diffusion start", &s, false)
	if err != nil {
		return err
	}
	a := s.args(passes)
	return e.dispatch(func(*hostImpl) error { return hostDiffusion(&s, passes, true) },
		func(c *cudaImpl) error { return c.diffusion(true, &s, &a) })
}

// DiffusionStep runs one fused step (see the type and the Coef* fields).
// Errors wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or
// exec.ErrDevice.
func (e *Engine) DiffusionStep(s DiffusionStep) error {
	passes, err := e.checkDiffStep("diffusion step", &s, true)
	if err != nil {
		return err
	}
	if s.Row == 0 {
		return fmt.Errorf("%w: diffusion step from row 0 (the start row)", ErrConfig)
	}
	a := s.args(passes)
	return e.dispatch(func(*hostImpl) error { return hostDiffusion(&s, passes, false) },
		func(c *cudaImpl) error { return c.diffusion(false, &s, &a) })
}

// diffusion launches diff_start_<in> (start) or diff_step_<eps>_<in>.
func (c *cudaImpl) diffusion(start bool, s *DiffusionStep, a *launch.DiffArgs) error {
	epsDT, inDT := tensor.F32, tensor.F32
	if s.Eps != nil && !start {
		epsDT = s.Eps.DType
	}
	if s.XIn != nil {
		inDT = s.XIn.DType
	}
	grid, block := gridFor((a.N+3)/4, 256), block1(256)
	if start {
		return launch.DiffStart(c, dtName(inDT), grid, block, 0, a)
	}
	return launch.DiffStep(c, dtName(epsDT)+dtSuffix(inDT), grid, block, 0, a)
}

// hostDiffusion is DiffusionStart (start) or DiffusionStep in f32, as the
// kernel computes it.
func hostDiffusion(s *DiffusionStep, passes int, start bool) error {
	step, err := hostStep(s.Counter)
	if err != nil {
		return err
	}
	cf, err := s.Coef.F32()
	if err != nil {
		return err
	}
	row := cf[s.Row*CoefWidth : (s.Row+1)*CoefWidth]
	x, err := s.X.F32()
	if err != nil {
		return err
	}
	var d, prev, eps []float32
	if s.D != nil {
		if d, err = s.D.F32(); err != nil {
			return err
		}
	}
	if s.Prev != nil {
		if prev, err = s.Prev.F32(); err != nil {
			return err
		}
	}
	if !start {
		if eps, err = hostIn(s.Eps); err != nil {
			return err
		}
	}
	n := len(x)
	var z [4]float32
	for i := range x {
		if i%4 == 0 {
			normal4(s.Seed, s.Stream, step, uint64(i)/4, &z)
		}
		if start {
			v := row[CoefS] * z[i%4]
			if prev != nil {
				v += row[CoefA] * prev[i]
			}
			x[i] = v
			continue
		}
		x[i] = diffUpdate(row, x[i], eps, i, n, passes, d, prev, z[i%4])
	}
	if s.XIn != nil {
		in := make([]float32, passes*n)
		for p := 0; p < passes; p++ {
			copy(in[p*n:], x)
		}
		if err := s.XIn.WriteFloat32(in); err != nil {
			return err
		}
	}
	if s.TIn != nil {
		ts := make([]int32, s.TIn.Numel())
		for i := range ts {
			ts[i] = int32(row[CoefTNext])
		}
		return s.TIn.Write(tensor.AsBytes(ts))
	}
	return nil
}

// diffUpdate is the step's update of element i (diffusion.cu's
// diff_update), writing x̂0 into d[i] when d is not nil.
func diffUpdate(row []float32, x float32, eps []float32, i, n, passes int, d, prev []float32, z float32) float32 {
	e := eps[i]
	switch {
	case passes == 2:
		u := eps[n+i]
		e = u + row[CoefGuidance]*(e-u)
	case prev != nil && row[CoefResidual] != 0:
		u := (x - row[CoefA]*prev[i]) / row[CoefS]
		e = u + row[CoefGuidance]*(e-u)
	}
	x0 := (x - row[CoefS]*e) / row[CoefA]
	if row[CoefClip] != 0 {
		x0 = min(max(x0, -1), 1)
	}
	if prev != nil && row[CoefBlend] != 0 {
		x0 = (1-row[CoefBlend])*x0 + row[CoefBlend]*prev[i]
	}
	out := row[CoefX]*x + row[CoefX0]*x0 + row[CoefSigma]*z
	if row[CoefEps] != 0 {
		out += row[CoefEps] * ((x - row[CoefA]*x0) / row[CoefS])
	}
	if d != nil {
		if row[CoefD] != 0 {
			out += row[CoefD] * d[i]
		}
		d[i] = x0
	}
	return out
}

// EMA updates ema = decay·ema + (1 − decay)·p element-wise in f32 (an
// exponential moving average of weights, as diffusion models sample from:
// Ho et al. 2020, §4): ema and p f32, contiguous, one shape. Errors wrap
// tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or
// ErrConfig (decay outside [0, 1]).
func (e *Engine) EMA(ema, p *tensor.Tensor, decay float32) error {
	if !(decay >= 0 && decay <= 1) {
		return fmt.Errorf("%w: EMA decay %v", ErrConfig, decay)
	}
	if err := e.checkView("ema", ema, true, []tensor.DType{tensor.F32}); err != nil {
		return err
	}
	if err := e.checkView("ema source", p, true, []tensor.DType{tensor.F32}, ema.Shape...); err != nil {
		return err
	}
	n := ema.Numel()
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		es, err := ema.F32()
		if err != nil {
			return err
		}
		ps, err := p.F32()
		if err != nil {
			return err
		}
		for i, v := range ps {
			es[i] = decay*es[i] + (1-decay)*v
		}
		return nil
	}, func(c *cudaImpl) error {
		inst := rwElemInst(ema, p)
		kernel := launch.DiffEmaS
		if inst == "v" {
			kernel = launch.DiffEmaV
		}
		return kernel(c, rwElemGrid(n, inst), block1(256), 0, devPtr(ema), devPtr(p), int64(n), decay)

	})
}

// QSample records the forward process (Engine.QSample) on x0 (an input,
// [N, ...], any float dtype) at timesteps t (i32 [N]) with the schedule
// tables sab, s1mab (f32 [T], √ᾱ and √(1−ᾱ)), drawing the noise from
// (the graph's Seed, stream, the graph's Counter): it returns x_t and the
// noise ε, both in the graph's activation dtype, neither with a gradient.
func (g *Graph) QSample(x0, t *Var, sab, s1mab *tensor.Tensor, stream uint32) (xt, eps *Var) {
	if !g.ok(x0, t) {
		return nil, nil
	}
	g.prefetch("diffusion.cu")
	if err := rwFloat("qsample x0", x0); err != nil {
		g.Fail("qsample", err)
		return nil, nil
	}
	dt := g.ActDType()
	xt = g.NewOut("qsample.xt", dt, x0.Value.Shape...)
	eps = g.NewOut("qsample.eps", dt, x0.Value.Shape...)
	if !g.ok(xt, eps) {
		return nil, nil
	}
	e, seed, counter := g.e, g.opts.Seed, g.opts.Counter
	g.Record("qsample", []*Var{x0, t}, []*Var{xt, eps}, func(*Grads) error {
		return e.QSample(xt.Value, eps.Value, x0.Value, t.Value, sab, s1mab, seed, stream, counter)
	}, nil)
	return xt, eps
}
