package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "precond", Check: checkPrecond}) }

// precondShapes are (m, n, maxBlock) with blocks that do and do not tile
// the matrix (padding in the last block row and column).
var precondShapes = [][3]int{{1, 1, 4}, {7, 5, 3}, {12, 8, 4}, {33, 17, 16}}

func checkPrecond(s *Suite) {
	s.Run("blocking", blockingCheck)
	for _, sh := range precondShapes {
		name := fmt.Sprintf("%dx%d/max=%d", sh[0], sh[1], sh[2])
		for _, v := range []struct {
			name    string
			beta1   float32
			adagrad bool
		}{{"adam", 0.9, false}, {"adagrad", 0.9, true}, {"no-beta1", 0, false}} {
			s.Run("shampoo-prep/"+v.name+"/"+name, func(s *Suite) { shampooPrepCheck(s, sh, v.beta1, v.adagrad) })
		}
		s.Run("graft-scale/"+name, func(s *Suite) { graftScaleCheck(s, sh) })
		s.Run("block-apply/"+name, func(s *Suite) { blockApplyCheck(s, sh) })
		s.Run("soap/"+name, func(s *Suite) { soapCheck(s, sh) })
	}
	s.Run("multi", precondMultiCheck)
	s.Run("pad-diag", padDiagCheck)
	s.Run("validation", precondValidation)
}

// precondMultiCheck runs the multi-tensor ops over 35 parameters (two
// launches on a GPU: 32 per launch) of every shape of precondShapes in
// turn, with the device's bias corrections (ShampooPrep.BC,
// BlockApply.CoefBC) and learning-rate scale: each parameter against its
// float64 reference.
func precondMultiCheck(s *Suite) {
	const n, beta1, beta2, eps, lr, coef, decay = 35, 0.9, 0.99, 1e-8, 0.01, 0.5, 0.1
	const c1, c2, lrs = 0.271, 0.0297, 0.25 // as bias corrections after a few steps
	bc := s.Const(tensor.F32, []float64{c1, c2}, 2)
	ls := s.Const(tensor.F32, []float64{lrs}, 1)
	bcv, lsv := s.Read(bc), s.Read(ls)
	type par struct {
		b                   ops.Blocking
		g, m, v, gs, gb, ga *tensor.Tensor
		gv, mv, vv          []float64
		p, d, scale         *tensor.Tensor
		pv, dv, sv          []float64
	}
	ps := make([]*par, n)
	var preps []ops.ShampooPrep
	var aps []ops.BlockApply
	for i := range ps {
		b := mustBlocking(s, precondShapes[i%len(precondShapes)])
		x := &par{b: b}
		x.g, x.gv = s.Rand(tensor.F32, 1, b.M, b.N)
		x.m, x.mv = s.Rand(tensor.F32, 0.1, b.M, b.N)
		_, x.vv = s.Rand(tensor.F32, 0.1, b.M, b.N)
		for k := range x.vv {
			x.vv[k] = math.Abs(x.vv[k])
		}
		x.v = s.Const(tensor.F32, x.vv, b.M, b.N)
		x.vv = s.Read(x.v)
		x.gs, x.gb, x.ga = s.Empty(tensor.F32, b.Shape()...), s.Empty(tensor.F32, b.Shape()...), s.Empty(tensor.F32, b.Shape()...)
		preps = append(preps, ops.ShampooPrep{G: x.g, M: x.m, V: x.v, GS: x.gs, GB: x.gb, GA: x.ga, Blk: b,
			Beta1: beta1, Beta2: beta2, Eps: eps, BC: bc})
		x.p, x.pv = s.Rand(tensor.F32, 1, b.M, b.N)
		x.d, x.dv = s.Rand(tensor.F32, 1, b.Shape()...)
		x.scale, x.sv = s.Rand(tensor.F32, 1, b.Count())
		aps = append(aps, ops.BlockApply{P: x.p, D: x.d, Scale: x.scale, Blk: b, LR: lr, Coef: coef, Decay: decay,
			LRScale: ls, CoefBC: bc})
		ps[i] = x
	}
	s.NoErr("shampoo preps", s.E.ShampooPreps(preps))
	s.NoErr("block applies", s.E.BlockApplies(aps))
	b1, b2 := float64(beta1), float64(beta2)
	tol := s.Tol(tensor.F32)
	for i, x := range ps {
		wm, tm, ga, ta := make([]float64, len(x.gv)), make([]float64, len(x.gv)), make([]float64, len(x.gv)), make([]float64, len(x.gv))
		for k, g := range x.gv {
			wm[k] = b1*x.mv[k] + (1-b1)*g
			tm[k] = math.Abs(b1*x.mv[k]) + math.Abs((1-b1)*g)
			vh := (b2*x.vv[k] + (1-b2)*g*g) / bcv[1]
			ga[k] = wm[k] / bcv[0] / (math.Sqrt(vh) + eps)
			ta[k] = tm[k] / bcv[0] / (math.Sqrt(vh) + eps)
		}
		s.Close(fmt.Sprintf("tensor %d m", i), s.Read(x.m), wm, tm, tol)
		s.Close(fmt.Sprintf("tensor %d GA", i), s.Read(x.ga), toBlocked(x.b, ga), toBlocked(x.b, ta), 1e-4)
		want, terms := make([]float64, len(x.pv)), make([]float64, len(x.pv))
		per := x.b.BR * x.b.BC
		l, cf := lr*lsv[0], coef*math.Sqrt(bcv[1])/bcv[0]
		for r := 0; r < x.b.M; r++ {
			for c := 0; c < x.b.N; c++ {
				k, e := r*x.b.N+c, x.b.Blocked(r, c)
				want[k] = x.pv[k] - l*(cf*x.sv[e/per]*x.dv[e]+decay*x.pv[k])
				terms[k] = math.Abs(x.pv[k]) + math.Abs(l*cf*x.sv[e/per]*x.dv[e]) + math.Abs(l*decay*x.pv[k])
			}
		}
		s.Close(fmt.Sprintf("tensor %d P", i), s.Read(x.p), want, terms, tol)
	}
}

func mustBlocking(s *Suite, sh [3]int) ops.Blocking {
	b, err := ops.NewBlocking(sh[0], sh[1], sh[2])
	s.NoErr("blocking", err)
	return b
}

func blockingCheck(s *Suite) {
	b, err := ops.NewBlocking(1152, 384, 1024)
	s.NoErr("blocking", err)
	if b.Rows != 2 || b.Cols != 1 || b.BR != 576 || b.BC != 384 {
		s.T.Errorf("1152×384 at 1024: %+v, want 2×1 blocks of 576×384", b)
	}
	b = mustBlocking(s, [3]int{7, 5, 3})
	if b.Rows != 3 || b.BR != 3 || b.Cols != 2 || b.BC != 3 || b.RealRows(4) != 1 || b.RealCols(5) != 2 || b.RealCols(4) != 3 {
		s.T.Errorf("7×5 at 3: %+v", b)
	}
	seen := map[int]bool{}
	for i := 0; i < b.M; i++ {
		for j := 0; j < b.N; j++ {
			k := b.Blocked(i, j)
			blk, r, c := k/(b.BR*b.BC), k%(b.BR*b.BC)/b.BC, k%b.BC
			if seen[k] || blk/b.Cols*b.BR+r != i || blk%b.Cols*b.BC+c != j {
				s.T.Fatalf("Blocked(%d, %d) = %d", i, j, k)
			}
			seen[k] = true
		}
	}
	if _, err := ops.NewBlocking(0, 3, 4); !errors.Is(err, ops.ErrConfig) {
		s.T.Errorf("empty blocking: %v", err)
	}
}

// toBlocked is the blocked form of x (m×n, row-major) in float64.
func toBlocked(b ops.Blocking, x []float64) []float64 {
	out := make([]float64, b.Count()*b.BR*b.BC)
	for i := 0; i < b.M; i++ {
		for j := 0; j < b.N; j++ {
			out[b.Blocked(i, j)] = x[i*b.N+j]
		}
	}
	return out
}

func shampooPrepCheck(s *Suite, sh [3]int, beta1 float32, adagrad bool) {
	b := mustBlocking(s, sh)
	const beta2, eps, t = 0.99, 1e-8, 3
	g, gv := s.Rand(tensor.F32, 1, b.M, b.N)
	m, mv := s.Rand(tensor.F32, 0.1, b.M, b.N)
	_, vv := s.Rand(tensor.F32, 0.1, b.M, b.N)
	for i := range vv { // a second moment is not negative
		vv[i] = math.Abs(vv[i])
	}
	v := s.Const(tensor.F32, vv, b.M, b.N)
	gs, gb, ga := s.Empty(tensor.F32, b.Shape()...), s.Empty(tensor.F32, b.Shape()...), s.Empty(tensor.F32, b.Shape()...)
	s.NoErr("shampoo prep", s.E.ShampooPrep(ops.ShampooPrep{G: g, M: m, V: v, GS: gs, GB: gb, GA: ga, Blk: b,
		Beta1: beta1, Beta2: beta2, Eps: eps, T: t, AdaGrad: adagrad}))
	b1, b2 := float64(beta1), float64(beta2)
	wm, wv, mh, a := make([]float64, len(gv)), make([]float64, len(gv)), make([]float64, len(gv)), make([]float64, len(gv))
	// The momentum's error is relative to its terms' size: β1·m and
	// (1−β1)·g may cancel (a 1×1 case failed at 2.5e-5 for one seed).
	tm, tmh, ta := make([]float64, len(gv)), make([]float64, len(gv)), make([]float64, len(gv)) // the terms of m, m̂, a
	for k, x := range gv {
		wm[k], mh[k] = mv[k], x
		if beta1 > 0 {
			wm[k] = b1*mv[k] + (1-b1)*x
			mh[k] = wm[k] / (1 - math.Pow(b1, t))
		}
		tm[k] = math.Abs(b1*mv[k]) + math.Abs((1-b1)*x)
		tmh[k] = tm[k]
		if beta1 > 0 {
			tmh[k] /= 1 - math.Pow(b1, t)
		}
		vh := 0.0
		if adagrad {
			wv[k] = vv[k] + x*x
			vh = wv[k]
		} else {
			wv[k] = b2*vv[k] + (1-b2)*x*x
			vh = wv[k] / (1 - math.Pow(b2, t))
		}
		a[k] = mh[k] / (math.Sqrt(vh) + eps)
		ta[k] = tmh[k] / (math.Sqrt(vh) + eps)
	}
	tol := s.Tol(tensor.F32)
	s.Close("m", s.Read(m), wm, tm, tol)
	s.Close("v", s.Read(v), wv, nil, tol)
	s.Close("GS", s.Read(gs), toBlocked(b, gv), nil, tol)
	s.Close("GB", s.Read(gb), toBlocked(b, mh), toBlocked(b, tmh), tol)
	s.Close("GA", s.Read(ga), toBlocked(b, a), toBlocked(b, ta), 1e-4)
}

func graftScaleCheck(s *Suite, sh [3]int) {
	b := mustBlocking(s, sh)
	sv := s.Weights(b.Count() * b.BR * b.BC)
	per := b.BR * b.BC
	for i := 0; i < per; i++ { // block 0 of S is zero: scale 0
		sv[i] = 0
	}
	st := s.Const(tensor.F32, sv, b.Shape()...)
	sv = s.Read(st)
	a, av := s.Rand(tensor.F32, 2, b.Shape()...)
	scale := s.Empty(tensor.F32, b.Count())
	s.NoErr("graft scale", s.E.GraftScale(scale, st, a))
	want := make([]float64, b.Count())
	for k := range want {
		var s0, s1 float64
		for i := k * per; i < (k+1)*per; i++ {
			s0 += sv[i] * sv[i]
			s1 += av[i] * av[i]
		}
		if s0 > 0 {
			want[k] = math.Sqrt(s1 / s0)
		}
	}
	s.Close("scale", s.Read(scale), want, nil, s.Tol(tensor.F32))
}

func blockApplyCheck(s *Suite, sh [3]int) {
	b := mustBlocking(s, sh)
	const lr, coef, decay = 0.01, 0.5, 0.1
	for _, withScale := range []bool{false, true} {
		p, pv := s.Rand(tensor.F32, 1, b.M, b.N)
		d, dv := s.Rand(tensor.F32, 1, b.Shape()...)
		var scale *tensor.Tensor
		sc := make([]float64, b.Count())
		for i := range sc {
			sc[i] = 1
		}
		if withScale {
			scale, sc = s.Rand(tensor.F32, 1, b.Count())
		}
		s.NoErr("block apply", s.E.BlockApply(ops.BlockApply{P: p, D: d, Scale: scale, Blk: b, LR: lr, Coef: coef, Decay: decay}))
		want := make([]float64, len(pv))
		per := b.BR * b.BC
		for i := 0; i < b.M; i++ {
			for j := 0; j < b.N; j++ {
				k, e := i*b.N+j, b.Blocked(i, j)
				want[k] = pv[k] - lr*(coef*sc[e/per]*dv[e]+decay*pv[k])
			}
		}
		s.Close(fmt.Sprintf("P (scale %v)", withScale), s.Read(p), want, nil, s.Tol(tensor.F32))
	}
}

func soapCheck(s *Suite, sh [3]int) {
	b := mustBlocking(s, sh)
	const beta1, beta2, eps = 0.95, 0.95, 1e-8
	g, gv := s.Rand(tensor.F32, 1, b.M, b.N)
	m, mv := s.Rand(tensor.F32, 0.1, b.M, b.N)
	gs, gm := s.Empty(tensor.F32, b.Shape()...), s.Empty(tensor.F32, b.Shape()...)
	s.NoErr("soap prep", s.E.SOAPPrep(g, m, gs, gm, b, beta1))
	// As in Shampoo's check, the momentum's error is relative to its
	// terms' size: β1·m and (1−β1)·g may cancel (a 1×1 case failed at
	// 4.1e-5 for GPUKIT_OPSTEST_SEED=15867075718408845379).
	wm := make([]float64, len(gv))
	for k := range gv {
		wm[k] = beta1*mv[k] + (1-beta1)*gv[k]
	}
	tm := Sum(Scaled(beta1, mv), Scaled(1-beta1, gv))
	tol := s.Tol(tensor.F32)
	s.Close("m", s.Read(m), wm, tm, tol)
	s.Close("GS", s.Read(gs), toBlocked(b, gv), nil, tol)
	s.Close("GM", s.Read(gm), toBlocked(b, wm), toBlocked(b, tm), tol)

	gr, grv := s.Rand(tensor.F32, 1, b.Shape()...)
	mr, mrv := s.Rand(tensor.F32, 1, b.Shape()...)
	vin := s.Weights(len(grv))
	for i := range vin {
		vin[i] = math.Abs(vin[i])
	}
	v := s.Const(tensor.F32, vin, b.Shape()...)
	vin = s.Read(v)
	out := s.Empty(tensor.F32, b.Shape()...)
	s.NoErr("soap adam", s.E.SOAPAdam(v, gr, mr, out, b, beta2, eps))
	wv, wo := append([]float64(nil), vin...), make([]float64, len(vin))
	per := b.BR * b.BC
	for i := range wo {
		blk, k := i/per, i%per
		if k/b.BC >= b.RealRows(blk) || k%b.BC >= b.RealCols(blk) {
			continue
		}
		wv[i] = beta2*vin[i] + (1-beta2)*grv[i]*grv[i]
		wo[i] = mrv[i] / (math.Sqrt(wv[i]) + eps)
	}
	s.Close("v", s.Read(v), wv, nil, tol)
	s.Close("out", s.Read(out), wo, nil, 1e-4)
}

func padDiagCheck(s *Suite) {
	const count, d = 3, 6
	real := []int32{6, 4, 1}
	sv := make([]float64, count*d*d)
	for b := 0; b < count; b++ {
		spd := RandSPD(s.R, int(real[b]), 10, 1)
		for i := 0; i < int(real[b]); i++ {
			for j := 0; j < int(real[b]); j++ {
				sv[(b*d+i)*d+j] = spd[i*int(real[b])+j]
			}
		}
	}
	st := s.Const(tensor.F32, sv, count, d, d)
	sv = s.Read(st)
	rt := UploadI32(s.T, s.A, real, count)
	s.NoErr("pad diag", s.E.PadDiag(st, rt))
	want := append([]float64(nil), sv...)
	for b := 0; b < count; b++ {
		var tr float64
		for i := 0; i < int(real[b]); i++ {
			tr += sv[(b*d+i)*d+i]
		}
		for i := int(real[b]); i < d; i++ {
			want[(b*d+i)*d+i] = 2*tr + 1
		}
	}
	s.Close("s", s.Read(st), want, nil, s.Tol(tensor.F32))
	// The padded coordinates come last in the eigenbasis, apart from the
	// real ones.
	q, w := s.Empty(tensor.F32, count, d, d), s.Empty(tensor.F32, count, d)
	s.NoErr("eigh", s.E.Eigh(ops.Eigh{A: st, Q: q, W: w}))
	qv := s.Read(q)
	for b := 0; b < count; b++ {
		re := int(real[b])
		for k := 0; k < re; k++ { // eigenvectors of the real part: no padded component
			for i := re; i < d; i++ {
				if math.Abs(qv[(b*d+k)*d+i]) > 1e-4 {
					s.T.Errorf("matrix %d: eigenvector %d has padded component %d = %v", b, k, i, qv[(b*d+k)*d+i])
				}
			}
		}
	}
}

func precondValidation(s *Suite) {
	b := mustBlocking(s, [3]int{7, 5, 3})
	p := s.Empty(tensor.F32, 7, 5)
	d := s.Empty(tensor.F32, b.Shape()...)
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"P shape", s.E.BlockApply(ops.BlockApply{P: s.Empty(tensor.F32, 5, 7), D: d, Blk: b}), tensor.ErrShape},
		{"D dtype", s.E.BlockApply(ops.BlockApply{P: p, D: s.Empty(tensor.BF16, b.Shape()...), Blk: b}), tensor.ErrDType},
		{"bad blocking", s.E.BlockApply(ops.BlockApply{P: p, D: d, Blk: ops.Blocking{M: 7, N: 5, BR: 2, BC: 3, Rows: 3, Cols: 2}}), ops.ErrConfig},
		{"prep β2", s.E.ShampooPrep(ops.ShampooPrep{G: p, V: p, GS: d, GB: d, GA: d, Blk: b, Beta2: 0, Eps: 1, T: 1}), ops.ErrConfig},
		{"prep T", s.E.ShampooPrep(ops.ShampooPrep{G: p, V: p, GS: d, GB: d, GA: d, Blk: b, Beta2: 0.9, Eps: 1, T: 0}), ops.ErrConfig},
		{"graft shapes", s.E.GraftScale(s.Empty(tensor.F32, 6), d, s.Empty(tensor.F32, 6, 3, 2)), tensor.ErrShape},
		{"soap adam ε", s.E.SOAPAdam(d, d, d, d, b, 0.9, 0), ops.ErrConfig},
		{"pad diag real", s.E.PadDiag(s.Empty(tensor.F32, 2, 3, 3), s.Empty(tensor.F32, 2)), tensor.ErrDType},
		{"applies differ", s.E.BlockApplies([]ops.BlockApply{{P: p, D: d, Blk: b, LR: 1}, {P: p, D: d, Blk: b, LR: 2}}), ops.ErrConfig},
		{"preps differ", s.E.ShampooPreps([]ops.ShampooPrep{{G: p, V: p, GS: d, GB: d, GA: d, Blk: b, Beta2: 0.9, Eps: 1, T: 1},
			{G: p, V: p, GS: d, GB: d, GA: d, Blk: b, Beta2: 0.9, Eps: 1, T: 2}}), ops.ErrConfig},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			s.T.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
}
