package opstest

import (
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "diffusion", Check: checkDiffusion}) }

// RefDiffusionStep is the float64 reference of one fused step (ops.Coef*
// rows): given x, the model outputs eps (passes·n values: conditional,
// then unconditional), the previous data prediction d (nil: none), the
// previous frame prev (nil: none) and the noise z, it returns x' and x̂0.
// With one pass, a previous frame and CoefResidual ≠ 0 the unconditional
// prediction is R-CFG's residual noise (x − A·prev)/S (ops.CoefResidual).
func RefDiffusionStep(row []float64, x, eps, d, prev, z []float64, passes int) (xn, x0 []float64) {
	n := len(x)
	xn, x0 = make([]float64, n), make([]float64, n)
	for i := range x {
		e := eps[i]
		switch {
		case passes == 2:
			u := eps[n+i]
			e = u + row[ops.CoefGuidance]*(e-u)
		case prev != nil && row[ops.CoefResidual] != 0:
			u := (x[i] - row[ops.CoefA]*prev[i]) / row[ops.CoefS]
			e = u + row[ops.CoefGuidance]*(e-u)
		}
		h := (x[i] - row[ops.CoefS]*e) / row[ops.CoefA]
		if row[ops.CoefClip] != 0 {
			h = math.Max(-1, math.Min(1, h))
		}
		if prev != nil {
			h = (1-row[ops.CoefBlend])*h + row[ops.CoefBlend]*prev[i]
		}
		ep := (x[i] - row[ops.CoefA]*h) / row[ops.CoefS]
		v := row[ops.CoefX]*x[i] + row[ops.CoefX0]*h + row[ops.CoefEps]*ep + row[ops.CoefSigma]*z[i]
		if d != nil {
			v += row[ops.CoefD] * d[i]
		}
		xn[i], x0[i] = v, h
	}
	return xn, x0
}

// normals are NormalAt's draws for n elements.
func normals(seed uint64, stream, step uint32, n int) []float64 {
	z := make([]float64, n)
	for i := range z {
		z[i] = float64(ops.NormalAt(seed, stream, step, int64(i)))
	}
	return z
}

// nearNormals compares device draws with NormalAt's (the kernels compute in
// f32: a few ulps of the value, more where log u1 is near 0).
func nearNormals(s *Suite, what string, got, want []float64, tol float64) {
	s.T.Helper()
	for i := range got {
		if d := math.Abs(got[i] - want[i]); !(d <= tol*math.Max(1, math.Abs(want[i]))) {
			s.T.Fatalf("%s: element %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

func checkDiffusion(s *Suite) {
	for _, dt := range s.DTypes() {
		s.Run(fmt.Sprintf("%v/noise", dt), func(s *Suite) { diffNoise(s, dt) })
		s.Run(fmt.Sprintf("%v/qsample", dt), func(s *Suite) { diffQSample(s, dt) })
		for _, passes := range []int{1, 2} {
			s.Run(fmt.Sprintf("%v/step/passes=%d", dt, passes), func(s *Suite) { diffStep(s, dt, passes) })
		}
	}
	s.Run("start", diffStart)
	s.Run("ema", func(s *Suite) {
		for _, n := range []int{1, 13, 4096} {
			e, ev := s.Rand(tensor.F32, 1, n)
			p, pv := s.Rand(tensor.F32, 1, n)
			s.NoErr("ema", s.E.EMA(e, p, 0.9))
			// The kernel's coefficients are f32 (decay, 1 − decay in f32);
			// the error is relative to the terms' size, not the result's,
			// which cancellation can make arbitrarily small (n = 1 failed
			// at 1.04e-5 for one seed against the plain relative error).
			d, om := float64(float32(0.9)), float64(float32(1)-float32(0.9))
			want := make([]float64, n)
			for i := range want {
				want[i] = d*ev[i] + om*pv[i]
			}
			s.Close(fmt.Sprintf("ema n=%d", n), s.Read(e), want, Sum(Scaled(d, ev), Scaled(om, pv)), 1e-6)
		}
	})
	s.Run("validation", diffValidation)
}

func diffNoise(s *Suite, dt tensor.DType) {
	const n = 40003
	ctr := UploadI32(s.T, s.A, []int32{7}, 1)
	a, b := s.Empty(dt, n), s.Empty(dt, n)
	s.NoErr("noise", s.E.GaussianNoise(a, 42, 3, ctr))
	s.NoErr("noise again", s.E.GaussianNoise(b, 42, 3, ctr))
	av, bv := s.Read(a), s.Read(b)
	s.Close("same seed, stream and step: same draws", av, bv, nil, 0)
	tol := 1e-5
	if dt == tensor.BF16 {
		tol = 8e-3
	}
	nearNormals(s, "draws", av, normals(42, 3, 7, n), tol)
	var m, v float64
	for _, z := range av {
		m += z
		v += z * z
	}
	m /= n
	v = v/n - m*m
	// 6 standard errors: N(0,1)'s mean has SE 1/√n, its variance √(2/n).
	if math.Abs(m) > 6/math.Sqrt(n) || math.Abs(v-1) > 6*math.Sqrt(2.0/n) {
		s.T.Errorf("mean %v, variance %v of %d draws", m, v, n)
	}
	// Another stream and another step draw other numbers.
	for _, c := range []struct {
		stream uint32
		step   int32
	}{{4, 7}, {3, 8}} {
		ctr2 := UploadI32(s.T, s.A, []int32{c.step}, 1)
		o := s.Empty(dt, n)
		s.NoErr("noise", s.E.GaussianNoise(o, 42, c.stream, ctr2))
		same := 0
		for i, z := range s.Read(o) {
			if z == av[i] {
				same++
			}
		}
		if same > n/100 {
			s.T.Errorf("stream %d step %d: %d of %d draws equal to stream 3 step 7", c.stream, c.step, same, n)
		}
	}
}

func diffQSample(s *Suite, dt tensor.DType) {
	const N, per, T = 5, 11, 20
	for _, xdt := range []tensor.DType{tensor.F32, dt} {
		x0, x0v := s.Rand(xdt, 1, N, per)
		ts := []int32{0, 19, 7, 7, 3}
		t := UploadI32(s.T, s.A, ts, N)
		ab := make([]float64, T)
		a, sm := make([]float64, T), make([]float64, T)
		for i := range ab {
			ab[i] = math.Cos(float64(i) / T * math.Pi / 2)
			a[i], sm[i] = math.Sqrt(ab[i]), math.Sqrt(1-ab[i])
		}
		sab, s1mab := s.Const(tensor.F32, a, T), s.Const(tensor.F32, sm, T)
		ctr := UploadI32(s.T, s.A, []int32{11}, 1)
		xt, eps := s.Empty(dt, N, per), s.Empty(dt, N, per)
		s.NoErr("qsample", s.E.QSample(xt, eps, x0, t, sab, s1mab, 9, 2, ctr))
		z := normals(9, 2, 11, N*per)
		want := make([]float64, N*per)
		for i := range want {
			k := ts[i/per]
			want[i] = float64(float32(a[k]))*x0v[i] + float64(float32(sm[k]))*z[i]
		}
		tol := 1e-5
		if dt == tensor.BF16 {
			tol = 8e-3
		}
		nearNormals(s, fmt.Sprintf("eps (x0 %v)", xdt), s.Read(eps), z, tol)
		nearNormals(s, fmt.Sprintf("xt (x0 %v)", xdt), s.Read(xt), want, 2*tol)
	}
}

// diffRow is a coefficient row with random weights (A, S > 0).
func diffRow(s *Suite, clip, blend bool, tnext int) []float64 {
	r := make([]float64, ops.CoefWidth)
	r[ops.CoefA] = 0.2 + 0.8*s.R.Float64()
	r[ops.CoefS] = 0.1 + 0.9*s.R.Float64()
	for _, k := range []int{ops.CoefX, ops.CoefX0, ops.CoefEps, ops.CoefD, ops.CoefSigma} {
		r[k] = s.R.NormFloat64()
	}
	r[ops.CoefGuidance] = 3
	r[ops.CoefTNext] = float64(tnext)
	if blend {
		r[ops.CoefBlend] = 0.3
	}
	if clip {
		r[ops.CoefClip] = 1
	}
	return r
}

func diffStep(s *Suite, dt tensor.DType, passes int) {
	const N, H, W = 3, 5, 7
	per := H * W
	for _, c := range []struct {
		clip, blend, useD, resid bool
	}{{false, false, false, false}, {true, false, true, false}, {true, true, true, false}, {false, true, false, false},
		{true, true, true, true}, {false, true, false, true}} {
		row := diffRow(s, c.clip, c.blend, 17)
		if c.resid {
			row[ops.CoefResidual] = 1 // R-CFG with one pass; ignored with two
		}
		rows := append(make([]float64, ops.CoefWidth), row...) // row 0: an unused start row
		coef := s.Const(tensor.F32, rows, 2, ops.CoefWidth)
		rowF := F64(F32(row)) // the f32 coefficients the device holds
		x, xv := s.Rand(tensor.F32, 1.5, N, H, W, 1)
		eps, epsv := s.Rand(dt, 1, passes*N, H, W, 1)
		var d, prev *tensor.Tensor
		var dv, pv []float64
		if c.useD {
			d, dv = s.Rand(tensor.F32, 1, N, H, W, 1)
		}
		if c.blend {
			prev, pv = s.Rand(tensor.F32, 1, N, H, W, 1)
		}
		xin := s.Empty(dt, passes*N, H, W, 1)
		tin := s.Empty(tensor.I32, passes*N)
		ctr := UploadI32(s.T, s.A, []int32{5}, 1)
		st := ops.DiffusionStep{X: x, D: d, Eps: eps, XIn: xin, TIn: tin, Prev: prev, Coef: coef, Counter: ctr, Row: 1, Seed: 77, Stream: 4}
		s.NoErr("step", s.E.DiffusionStep(st))
		z := normals(77, 4, 5, N*per)
		wx, wx0 := RefDiffusionStep(rowF, xv, epsv, dv, pv, z, passes)
		name := fmt.Sprintf("clip=%v blend=%v d=%v resid=%v", c.clip, c.blend, c.useD, c.resid)
		// Dividing by A amplifies the rounding of x (and of S·ε): x̂0's
		// terms are |x|/A, and x' sums x̂0 and ε with its coefficients.
		tx0 := Scaled(1/rowF[ops.CoefA], xv)
		if c.resid && passes == 1 {
			// R-CFG: x̂0 = g·(x − S·ε_c)/A + (1 − g)·prev, before clipping.
			g := rowF[ops.CoefGuidance]
			for i := range tx0 {
				tx0[i] = (math.Abs(g)*(math.Abs(xv[i])+rowF[ops.CoefS]*math.Abs(epsv[i])) + math.Abs(1-g)*(math.Abs(xv[i])+rowF[ops.CoefA]*math.Abs(pv[i]))) / rowF[ops.CoefA]
			}
		}
		tx := Scaled(math.Abs(rowF[ops.CoefX0])+math.Abs(rowF[ops.CoefEps])+1, tx0)
		s.Close("x' "+name, s.Read(x), wx, tx, 1e-5)
		if c.useD {
			s.Close("d = x̂0 "+name, s.Read(d), wx0, tx0, 1e-5)
		}
		in := s.Read(xin)
		for p := 0; p < passes; p++ {
			s.Close(fmt.Sprintf("model input pass %d %s", p, name), in[p*N*per:(p+1)*N*per], wx, tx, s.Tol(dt))
		}
		for _, tv := range DownloadI32(s.T, tin) {
			if tv != 17 {
				s.T.Fatalf("next timesteps %v, want 17", DownloadI32(s.T, tin))
			}
		}
	}
}

func diffStart(s *Suite) {
	const N, per = 2, 9
	row := make([]float64, ops.CoefWidth)
	row[ops.CoefA], row[ops.CoefS], row[ops.CoefTNext] = 0.6, 0.8, 999
	coef := s.Const(tensor.F32, row, 1, ops.CoefWidth)
	z := normals(5, 0, 0, N*per)
	for _, withPrev := range []bool{false, true} {
		x := s.Empty(tensor.F32, N, per)
		xin := s.Empty(tensor.BF16, 2*N, per)
		tin := s.Empty(tensor.I32, 2*N)
		var prev *tensor.Tensor
		var pv []float64
		if withPrev {
			prev, pv = s.Rand(tensor.F32, 1, N, per)
		}
		s.NoErr("start", s.E.DiffusionStart(ops.DiffusionStep{X: x, XIn: xin, TIn: tin, Prev: prev, Coef: coef, Seed: 5}))
		want := make([]float64, N*per)
		for i := range want {
			want[i] = float64(float32(0.8)) * z[i]
			if withPrev {
				want[i] += float64(float32(0.6)) * pv[i]
			}
		}
		nearNormals(s, fmt.Sprintf("x (prev=%v)", withPrev), s.Read(x), want, 1e-5)
		in := s.Read(xin)
		s.Close("model input", in[:N*per], want, want, 1e-2)
		s.Close("model input (second pass)", in[N*per:], want, want, 1e-2)
		for _, tv := range DownloadI32(s.T, tin) {
			if tv != 999 {
				s.T.Fatalf("timesteps %v, want 999", DownloadI32(s.T, tin))
			}
		}
	}
}

func diffValidation(s *Suite) {
	x := s.Empty(tensor.F32, 2, 3)
	coef := s.Empty(tensor.F32, 2, ops.CoefWidth)
	eps := s.Empty(tensor.F32, 2, 3)
	for _, c := range []struct {
		what string
		err  error
	}{
		{"eps of 3 passes", s.E.DiffusionStep(ops.DiffusionStep{X: x, Eps: s.Empty(tensor.F32, 6, 3), Coef: coef, Row: 1})},
		{"bf16 x", s.E.DiffusionStep(ops.DiffusionStep{X: s.Empty(tensor.BF16, 2, 3), Eps: eps, Coef: coef, Row: 1})},
		{"row 0", s.E.DiffusionStep(ops.DiffusionStep{X: x, Eps: eps, Coef: coef, Row: 0})},
		{"row past the table", s.E.DiffusionStep(ops.DiffusionStep{X: x, Eps: eps, Coef: coef, Row: 2})},
		{"narrow table", s.E.DiffusionStep(ops.DiffusionStep{X: x, Eps: eps, Coef: s.Empty(tensor.F32, 2, 8), Row: 1})},
		{"timesteps of the wrong size", s.E.DiffusionStep(ops.DiffusionStep{X: x, Eps: eps, TIn: s.Empty(tensor.I32, 3), Coef: coef, Row: 1})},
		{"model input for 2 passes, eps for 1", s.E.DiffusionStep(ops.DiffusionStep{X: x, Eps: eps, XIn: s.Empty(tensor.F32, 4, 3), Coef: coef, Row: 1})},
		{"d of another shape", s.E.DiffusionStep(ops.DiffusionStep{X: x, Eps: eps, D: s.Empty(tensor.F32, 3, 2), Coef: coef, Row: 1})},
		{"counter of two", s.E.GaussianNoise(x, 1, 0, s.Empty(tensor.I32, 2))},
		{"f32 counter", s.E.GaussianNoise(x, 1, 0, s.Empty(tensor.F32, 1))},
		{"qsample t of the wrong size", s.E.QSample(x, x, x, s.Empty(tensor.I32, 3), s.Empty(tensor.F32, 4), s.Empty(tensor.F32, 4), 0, 0, nil)},
		{"qsample tables of different sizes", s.E.QSample(x, x, x, s.Empty(tensor.I32, 2), s.Empty(tensor.F32, 4), s.Empty(tensor.F32, 5), 0, 0, nil)},
		{"ema decay 2", s.E.EMA(x, x, 2)},
		{"ema of another shape", s.E.EMA(x, s.Empty(tensor.F32, 3, 2), 0.5)},
	} {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
}
