package opstest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// Shapes are the (M, K, N) GEMM shapes CheckImpl uses: tiny, odd, and not
// multiples of 8 or 16, plus one aligned.
var Shapes = [][3]int{{1, 1, 1}, {3, 5, 7}, {8, 16, 8}, {17, 33, 9}, {61, 130, 31}}

var acts = []ops.Act{ops.ActNone, ops.ActReLU, ops.ActGELU}

type suite struct {
	t   *testing.T
	e   *ops.Engine
	a   device.Allocator
	r   *rand.Rand
	tol float64
}

// CheckImpl runs every op through an Engine on dev with opts and compares
// each output with the float64 references of this package (relative error
// ≤ tol, exact for Argmax, Fill and the AdamW step counter); checks Linear's
// and CrossEntropy's gradients (dense labels) against central finite differences
// of the references; checks the chained backward (LinearBackwardChain and
// Linear's ReLU bit-mask) the same ways when the backend has it, and
// ErrNoBackend when it has not; poisons every output with NaN first; and checks that
// the Engine rejects bad shapes, dtypes and layouts. Inputs are fresh random
// draws each run; the seed is logged, and GPUKIT_OPSTEST_SEED repeats it. tol is 1e-5
// for f32 arithmetic; looser for TF32/BF16 GEMMs.
func CheckImpl(t *testing.T, dev device.Device, opts ops.Options, tol float64) {
	t.Helper()
	checkImpl(t, dev, opts, tol, seed(t))
}

// checkImpl is CheckImpl with the seed given.
func checkImpl(t *testing.T, dev device.Device, opts ops.Options, tol float64, seed uint64) {
	t.Helper()
	e, err := ops.NewEngine(dev, opts)
	if err != nil {
		t.Fatalf("NewEngine(%v): %v", dev, err)
	}
	s := &suite{t: t, e: e, a: device.Local{Dev: dev}, r: rand.New(rand.NewPCG(seed, 1)), tol: tol}
	t.Run("Linear", s.linear)
	t.Run("LinearView", s.linearView)
	t.Run("LinearBackward", s.linearBackward)
	t.Run("LinearGradFD", s.linearGradFD)
	t.Run("LinearReLUMask", s.linearReLUMask)
	t.Run("LinearBackwardChain", s.linearChain)
	t.Run("LinearChainGradFD", s.linearChainGradFD)
	t.Run("LinearChainValidation", s.chainValidation)
	t.Run("CrossEntropyDense", s.softmaxCE)
	t.Run("CrossEntropyDenseGradFD", s.softmaxCEGradFD)
	t.Run("AdamW", s.adamw)
	t.Run("SGD", s.sgd)
	t.Run("Argmax", s.argmax)
	t.Run("Fill", s.fill)
	t.Run("Validation", s.validation)
}

func (s *suite) rnd(t *testing.T, shape ...int) (*tensor.Tensor, []float64) {
	v := Rand(s.r, tensor.Numel(shape))
	return Upload(t, s.a, v, shape...), F64(v)
}

func (s *suite) linear(t *testing.T) {
	for _, sh := range Shapes {
		m, k, n := sh[0], sh[1], sh[2]
		for _, act := range acts {
			for _, bias := range []bool{false, true} {
				name := fmt.Sprintf("%dx%dx%d/%v/bias=%v", m, k, n, act, bias)
				x, xf := s.rnd(t, m, k)
				w, wf := s.rnd(t, n, k)
				var b *tensor.Tensor
				var bf []float64
				if bias {
					b, bf = s.rnd(t, n)
				}
				y := Empty(t, s.a, tensor.F32, m, n)
				aux := Empty(t, s.a, tensor.F32, m, n)
				if err := s.e.Linear(y, x, w, b, aux, act); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				wantY, wantZ := LinearRef(xf, wf, bf, m, k, n, act)
				// Reduced precision rounds the operands, so its error is bounded
				// by the magnitude of the terms, Σ|x||w| + |b|, not by the result,
				// which can cancel (a 1×1×1 z = x·w + b in bf16 did).
				_, mag := LinearRef(Abs(xf), Abs(wf), Abs(bf), m, k, n, ops.ActNone)
				Close(t, name+" y", Download(t, y), wantY, mag, s.tol)
				Close(t, name+" aux", Download(t, aux), wantZ, mag, s.tol)
				// Without aux.
				y2 := Empty(t, s.a, tensor.F32, m, n)
				if err := s.e.Linear(y2, x, w, b, nil, act); err != nil {
					t.Fatalf("%s no aux: %v", name, err)
				}
				Close(t, name+" y (no aux)", Download(t, y2), wantY, mag, s.tol)
			}
		}
	}
}

// linearView runs Linear on row views at a non-zero offset into larger
// buffers, and checks that the rows around the output view stay untouched.
func (s *suite) linearView(t *testing.T) {
	m, k, n := 5, 11, 6
	big, bigf := s.rnd(t, m+3, k)
	x, err := big.Rows(2, 2+m)
	if err != nil {
		t.Fatal(err)
	}
	w, wf := s.rnd(t, n, k)
	b, bf := s.rnd(t, n)
	ybig := Empty(t, s.a, tensor.F32, m+2, n)
	y, err := ybig.Rows(1, 1+m)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.e.Linear(y, x, w, b, nil, ops.ActGELU); err != nil {
		t.Fatal(err)
	}
	want, _ := LinearRef(bigf[2*k:(2+m)*k], wf, bf, m, k, n, ops.ActGELU)
	got := Download(t, ybig)
	Close(t, "view y", got[n:(1+m)*n], want, nil, s.tol)
	for _, v := range append(got[:n:n], got[(1+m)*n:]...) {
		if !math.IsNaN(v) {
			t.Fatalf("Linear wrote outside its output view")
		}
	}
}

func (s *suite) linearBackward(t *testing.T) {
	for _, sh := range Shapes {
		m, k, n := sh[0], sh[1], sh[2]
		for _, act := range acts {
			for _, full := range []bool{true, false} {
				name := fmt.Sprintf("%dx%dx%d/%v/dx,db=%v", m, k, n, act, full)
				x, xf := s.rnd(t, m, k)
				w, wf := s.rnd(t, n, k)
				_, bf := s.rnd(t, n)
				dy, dyf := s.rnd(t, m, n)
				yf, zf := LinearRef(xf, wf, bf, m, k, n, act)
				var aux *tensor.Tensor
				switch act {
				case ops.ActGELU:
					aux = Upload(t, s.a, F32(zf), m, n)
				case ops.ActReLU:
					aux = Upload(t, s.a, F32(yf), m, n)
				}
				dw := Empty(t, s.a, tensor.F32, n, k)
				var dx, db *tensor.Tensor
				if full {
					dx = Empty(t, s.a, tensor.F32, m, k)
					db = Empty(t, s.a, tensor.F32, n)
				}
				if err := s.e.LinearBackward(dx, dw, db, dy, x, w, aux, act); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				wdx, wdw, wdb := LinearBackwardRef(dyf, xf, wf, zf, m, k, n, act)
				// Relative to the terms' size: GELU's derivative
				// Φ(z) + z·φ(z) cancels to zero near z ≈ −0.75, where its
				// f32 value keeps only an absolute accuracy (a 1×1×1 case
				// failed at 1.6e-4 for GPUKIT_OPSTEST_SEED=17567697227405081925);
				// the magnitudes are the sums with |dy|, |x|, |w| and the
				// derivative's terms taken as 1.
				mdx, mdw, mdb := LinearBackwardRef(Abs(dyf), Abs(xf), Abs(wf), zf, m, k, n, ops.ActNone)
				near := func(what string, got, want, mag []float64) {
					t.Helper()
					Close(t, what, got, want, mag, s.tol)
				}
				near(name+" dw", Download(t, dw), wdw, mdw)
				if full {
					near(name+" dx", Download(t, dx), wdx, mdx)
					near(name+" db", Download(t, db), wdb, mdb)
				}
			}
		}
	}
}

// linearGradFD checks LinearBackward against central differences of
// L(x, w, b) = Σ dy ⊙ act(x·wᵀ + b) computed in float64.
func (s *suite) linearGradFD(t *testing.T) {
	for _, sh := range [][3]int{{3, 5, 4}, {6, 9, 7}} {
		m, k, n := sh[0], sh[1], sh[2]
		for _, act := range acts {
			name := fmt.Sprintf("%dx%dx%d/%v", m, k, n, act)
			var x, w, b *tensor.Tensor
			var xf, wf, bf []float64
			for kink := true; kink; { // keep every z away from ReLU's kink
				x, xf = s.rnd(t, m, k)
				w, wf = s.rnd(t, n, k)
				b, bf = s.rnd(t, n)
				_, z := LinearRef(xf, wf, bf, m, k, n, act)
				// The device computes z at the precision under test; a z closer
				// to 0 than its rounding error can land on the other side of
				// ReLU's kink there (seen with bf16 on a GPU: a whole row of
				// the mask flipped), so the margin grows with the tolerance.
				margin := max(1e-3, 5*s.tol)
				kink = slices.ContainsFunc(z, func(v float64) bool { return math.Abs(v) < margin })
			}
			dy, dyf := s.rnd(t, m, n)
			aux := Empty(t, s.a, tensor.F32, m, n)
			y := Empty(t, s.a, tensor.F32, m, n)
			if err := s.e.Linear(y, x, w, b, aux, act); err != nil {
				t.Fatal(err)
			}
			saved := aux
			if act == ops.ActReLU {
				saved = y
			}
			dx := Empty(t, s.a, tensor.F32, m, k)
			dw := Empty(t, s.a, tensor.F32, n, k)
			db := Empty(t, s.a, tensor.F32, n)
			if err := s.e.LinearBackward(dx, dw, db, dy, x, w, saved, act); err != nil {
				t.Fatal(err)
			}
			loss := func() float64 {
				yy, _ := LinearRef(xf, wf, bf, m, k, n, act)
				var l float64
				for i := range yy {
					l += yy[i] * dyf[i]
				}
				return l
			}
			f := func([]float64) float64 { return loss() }
			const h = 1e-6
			// Finite differences check the gradient formula; the terms are
			// the sums with |dy|, |x|, |w| and the activation's derivative
			// taken as 1 (a tiny sum, db over 3 rows, can cancel).
			_, zf := LinearRef(xf, wf, bf, m, k, n, act)
			mdx, mdw, mdb := LinearBackwardRef(Abs(dyf), Abs(xf), Abs(wf), zf, m, k, n, ops.ActNone)
			Close(t, name+" dx", Download(t, dx), FiniteDiff(f, xf, h), mdx, s.tol)
			Close(t, name+" dw", Download(t, dw), FiniteDiff(f, wf, h), mdw, s.tol)
			Close(t, name+" db", Download(t, db), FiniteDiff(f, bf, h), mdb, s.tol)
		}
	}
}

func (s *suite) labels(t *testing.T, m, c int) (*tensor.Tensor, []int32) {
	l := make([]int32, m)
	for i := range l {
		l[i] = int32(s.r.IntN(c))
	}
	return UploadI32(t, s.a, l, m), l
}

func (s *suite) softmaxCE(t *testing.T) {
	for _, sh := range [][2]int{{1, 1}, {1, 2}, {7, 10}, {33, 17}, {64, 1000}} {
		for _, scale := range []float64{1, 30} {
			for _, shift := range []float64{0, 1000} {
				m, c := sh[0], sh[1]
				name := fmt.Sprintf("%dx%d/scale=%v/shift=%v", m, c, scale, shift)
				xf := F64(Rand(s.r, m*c))
				for i := range xf {
					xf[i] = float64(float32(xf[i]*scale + shift))
				}
				logits := Upload(t, s.a, F32(xf), m, c)
				labels, lf := s.labels(t, m, c)
				loss := Empty(t, s.a, tensor.F32, 1)
				dl := Empty(t, s.a, tensor.F32, m, c)
				if err := s.e.CrossEntropy(loss, dl, logits, labels, false); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				wl, wd := SoftmaxCrossEntropyRef(xf, lf, m, c)
				tl, td := CrossEntropyTerms(xf, lf, m, c)
				Close(t, name+" loss", Download(t, loss), []float64{wl}, []float64{tl}, s.tol)
				Close(t, name+" dlogits", Download(t, dl), wd, td, s.tol)
			}
		}
	}
}

func (s *suite) softmaxCEGradFD(t *testing.T) {
	m, c := 4, 6
	logits, xf := s.rnd(t, m, c)
	for i := range xf { // spread the logits so softmax is not flat
		xf[i] = float64(float32(xf[i] * 3))
	}
	if err := logits.WriteF32(F32(xf)); err != nil {
		t.Fatal(err)
	}
	labels, lf := s.labels(t, m, c)
	loss := Empty(t, s.a, tensor.F32, 1)
	dl := Empty(t, s.a, tensor.F32, m, c)
	if err := s.e.CrossEntropy(loss, dl, logits, labels, false); err != nil {
		t.Fatal(err)
	}
	fd := FiniteDiff(func(x []float64) float64 { l, _ := SoftmaxCrossEntropyRef(x, lf, m, c); return l }, xf, 1e-6)
	Close(t, "dlogits vs finite differences", Download(t, dl), fd, nil, s.tol)
}

var paramShapes = [][]int{{5, 3}, {7}, {1}, {17, 9}}

func (s *suite) adamw(t *testing.T) {
	// The third configuration follows a schedule through LRScale (a device
	// scalar rewritten before every step) and exempts two params from
	// weight decay (NoDecay).
	sched := Upload(t, s.a, []float32{1}, 1)
	scheduled := ops.AdamWConfig{LR: 2e-2, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.1,
		LRScale: sched, NoDecay: []bool{false, true, true, false}}
	for _, cfg := range []ops.AdamWConfig{ops.DefaultAdamW, {LR: 3e-2, Beta1: 0.8, Beta2: 0.95, Eps: 1e-6, WeightDecay: 0.1}, scheduled} {
		for _, start := range []int32{0, 41} {
			var ps, gs, ms, vs []*tensor.Tensor
			var pf, mf, vf, tpf, tmf [][]float64 // tpf, tmf: the terms' sizes of p and m
			for _, sh := range paramShapes {
				p, f := s.rnd(t, sh...)
				ps, pf, tpf = append(ps, p), append(pf, f), append(tpf, Abs(f))
				gs = append(gs, Empty(t, s.a, tensor.F32, sh...))
				// Moments start from random non-negative v when resuming.
				m, mff := s.rnd(t, sh...)
				v, vff := s.rnd(t, sh...)
				for i := range vff {
					vff[i] = vff[i] * vff[i]
				}
				if err := v.WriteF32(F32(vff)); err != nil {
					t.Fatal(err)
				}
				if start == 0 {
					for _, z := range []*tensor.Tensor{m, v} {
						if err := s.e.Fill(z, 0); err != nil {
							t.Fatal(err)
						}
					}
					mff, vff = make([]float64, len(mff)), make([]float64, len(vff))
				}
				ms, mf, tmf = append(ms, m), append(mf, mff), append(tmf, Abs(mff))
				vs, vf = append(vs, v), append(vf, vff)
			}
			step := UploadI32(t, s.a, []int32{start}, 1)
			for k := 1; k <= 5; k++ {
				name := fmt.Sprintf("lr=%g,wd=%g,scheduled=%v/start=%d/step %d", cfg.LR, cfg.WeightDecay, cfg.LRScale != nil, start, k)
				ref := cfg
				if cfg.LRScale != nil {
					scale := float32(0.5 + 0.25*float64(k))
					if err := cfg.LRScale.WriteF32([]float32{scale}); err != nil {
						t.Fatal(err)
					}
					ref.LR = cfg.LR * scale
				}
				for i, g := range gs {
					gv := Rand(s.r, g.Numel())
					if err := g.WriteF32(gv); err != nil {
						t.Fatal(err)
					}
					ri := ref
					if i < len(cfg.NoDecay) && cfg.NoDecay[i] {
						ri.WeightDecay = 0
					}
					AdamWTermsRef(tpf[i], tmf[i], F64(gv), vf[i], int(start)+k, ri)
					AdamWRef(pf[i], F64(gv), mf[i], vf[i], int(start)+k, ri)
				}
				if err := s.e.AdamW(ps, gs, ms, vs, step, cfg); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				for i := range ps {
					Close(t, fmt.Sprintf("%s param %d", name, i), Download(t, ps[i]), pf[i], tpf[i], s.tol)
					Close(t, fmt.Sprintf("%s m %d", name, i), Download(t, ms[i]), mf[i], tmf[i], s.tol)
					Close(t, fmt.Sprintf("%s v %d", name, i), Download(t, vs[i]), vf[i], nil, s.tol)
				}
				if got := DownloadI32(t, step)[0]; got != start+int32(k) {
					t.Fatalf("%s: step counter %d, want %d", name, got, start+int32(k))
				}
			}
		}
	}
}

func (s *suite) sgd(t *testing.T) {
	for _, cfg := range []ops.SGDConfig{{LR: 0.1}, {LR: 0.05, Momentum: 0.9, WeightDecay: 1e-2}} {
		var ps, gs, bs []*tensor.Tensor
		var pf, bf, tpf, tbf [][]float64 // tpf, tbf: the terms' sizes of p and buf
		for _, sh := range paramShapes {
			p, f := s.rnd(t, sh...)
			ps, pf, tpf = append(ps, p), append(pf, f), append(tpf, Abs(f))
			tbf = append(tbf, make([]float64, len(f)))
			gs = append(gs, Empty(t, s.a, tensor.F32, sh...))
			b := Empty(t, s.a, tensor.F32, sh...)
			if err := s.e.Fill(b, 0); err != nil {
				t.Fatal(err)
			}
			bs, bf = append(bs, b), append(bf, make([]float64, tensor.Numel(sh)))
		}
		for k := 1; k <= 5; k++ {
			name := fmt.Sprintf("%+v/step %d", cfg, k)
			for i, g := range gs {
				gv := Rand(s.r, g.Numel())
				if err := g.WriteF32(gv); err != nil {
					t.Fatal(err)
				}
				SGDTermsRef(tpf[i], tbf[i], F64(gv), cfg)
				SGDRef(pf[i], F64(gv), bf[i], cfg)
			}
			if err := s.e.SGD(ps, gs, bs, cfg); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			for i := range ps {
				Close(t, fmt.Sprintf("%s param %d", name, i), Download(t, ps[i]), pf[i], tpf[i], s.tol)
				Close(t, fmt.Sprintf("%s momentum %d", name, i), Download(t, bs[i]), bf[i], tbf[i], s.tol)
			}
		}
	}
}

func (s *suite) argmax(t *testing.T) {
	for _, sh := range [][2]int{{1, 1}, {5, 7}, {33, 10}, {3, 1000}} {
		for _, ties := range []bool{false, true} {
			m, n := sh[0], sh[1]
			v := Rand(s.r, m*n)
			if ties { // few distinct values: ties everywhere
				for i := range v {
					v[i] = float32(s.r.IntN(3))
				}
			}
			x := Upload(t, s.a, v, m, n)
			out := Empty(t, s.a, tensor.I32, m)
			if err := s.e.Argmax(out, x); err != nil {
				t.Fatal(err)
			}
			want := ArgmaxRef(v, m, n)
			got := DownloadI32(t, out)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%dx%d ties=%v: row %d argmax %d, want %d", m, n, ties, i, got[i], want[i])
				}
			}
		}
	}
}

func (s *suite) fill(t *testing.T) {
	for _, n := range []int{1, 7, 1000, 4099} {
		v := 2*s.r.Float64() - 1
		f := Empty(t, s.a, tensor.F32, n)
		if err := s.e.Fill(f, v); err != nil {
			t.Fatal(err)
		}
		for i, got := range Download(t, f) {
			if got != float64(float32(v)) {
				t.Fatalf("f32 fill %d: element %d = %v, want %v", n, i, got, float32(v))
			}
		}
		iv := int32(s.r.IntN(2000) - 1000)
		it := Empty(t, s.a, tensor.I32, n)
		if err := s.e.Fill(it, float64(iv)); err != nil {
			t.Fatal(err)
		}
		for i, got := range DownloadI32(t, it) {
			if got != iv {
				t.Fatalf("i32 fill %d: element %d = %d, want %d", n, i, got, iv)
			}
		}
	}
	// A row view: only its rows change.
	big := Empty(t, s.a, tensor.F32, 6, 5)
	rows, err := big.Rows(2, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.e.Fill(rows, 1.5); err != nil {
		t.Fatal(err)
	}
	for i, got := range Download(t, big) {
		inside := i >= 10 && i < 20
		if inside && got != 1.5 || !inside && !math.IsNaN(got) {
			t.Fatalf("fill of rows [2,4): element %d = %v", i, got)
		}
	}
}

func (s *suite) validation(t *testing.T) {
	f := func(shape ...int) *tensor.Tensor { return Empty(t, s.a, tensor.F32, shape...) }
	i := func(shape ...int) *tensor.Tensor { return Empty(t, s.a, tensor.I32, shape...) }
	x, w, b, y := f(4, 3), f(5, 3), f(5), f(4, 5)
	transposed := &tensor.Tensor{Buf: x.Buf, DType: tensor.F32, Shape: []int{3, 4}, Strides: []int{1, 3}}
	step := i(1)
	cases := []struct {
		name string
		want error
		run  func() error
	}{
		{"linear w inner dim", tensor.ErrShape, func() error { return s.e.Linear(y, x, f(5, 4), b, nil, ops.ActNone) }},
		{"linear y shape", tensor.ErrShape, func() error { return s.e.Linear(f(5, 4), x, w, b, nil, ops.ActNone) }},
		{"linear bias shape", tensor.ErrShape, func() error { return s.e.Linear(y, x, w, f(4), nil, ops.ActNone) }},
		{"linear aux shape", tensor.ErrShape, func() error { return s.e.Linear(y, x, w, b, f(4, 4), ops.ActGELU) }},
		{"linear x dtype", tensor.ErrDType, func() error { return s.e.Linear(y, i(4, 3), w, b, nil, ops.ActNone) }},
		{"linear nil x", tensor.ErrShape, func() error { return s.e.Linear(y, nil, w, b, nil, ops.ActNone) }},
		{"linear 1-d x", tensor.ErrShape, func() error { return s.e.Linear(y, f(12), w, b, nil, ops.ActNone) }},
		{"linear strided x", tensor.ErrLayout, func() error { return s.e.Linear(f(3, 5), transposed, f(5, 4), b, nil, ops.ActNone) }},
		{"linear bad act", ops.ErrConfig, func() error { return s.e.Linear(y, x, w, b, nil, ops.Act(9)) }},
		{"backward dw shape", tensor.ErrShape, func() error { return s.e.LinearBackward(nil, f(3, 5), nil, y, x, w, nil, ops.ActNone) }},
		{"backward dy shape", tensor.ErrShape, func() error { return s.e.LinearBackward(nil, f(5, 3), nil, f(5, 4), x, w, nil, ops.ActNone) }},
		{"backward gelu no aux", tensor.ErrShape, func() error { return s.e.LinearBackward(nil, f(5, 3), nil, y, x, w, nil, ops.ActGELU) }},
		{"backward dx dtype", tensor.ErrDType, func() error { return s.e.LinearBackward(i(4, 3), f(5, 3), nil, y, x, w, nil, ops.ActNone) }},
		{"ce labels dtype", tensor.ErrDType, func() error { return s.e.CrossEntropy(f(1), f(4, 5), y, f(4), false) }},
		{"ce labels shape", tensor.ErrShape, func() error { return s.e.CrossEntropy(f(1), f(4, 5), y, i(5), false) }},
		{"ce loss shape", tensor.ErrShape, func() error { return s.e.CrossEntropy(f(2), f(4, 5), y, i(4), false) }},
		{"ce dlogits shape", tensor.ErrShape, func() error { return s.e.CrossEntropy(f(1), f(5, 4), y, i(4), false) }},
		{"adamw count", tensor.ErrShape, func() error {
			return s.e.AdamW([]*tensor.Tensor{w}, []*tensor.Tensor{f(5, 3)}, []*tensor.Tensor{f(5, 3)}, nil, step, ops.DefaultAdamW)
		}},
		{"adamw grad shape", tensor.ErrShape, func() error {
			return s.e.AdamW([]*tensor.Tensor{w}, []*tensor.Tensor{f(3, 5)}, []*tensor.Tensor{f(5, 3)}, []*tensor.Tensor{f(5, 3)}, step, ops.DefaultAdamW)
		}},
		{"adamw step dtype", tensor.ErrDType, func() error {
			return s.e.AdamW([]*tensor.Tensor{w}, []*tensor.Tensor{f(5, 3)}, []*tensor.Tensor{f(5, 3)}, []*tensor.Tensor{f(5, 3)}, f(1), ops.DefaultAdamW)
		}},
		{"adamw beta", ops.ErrConfig, func() error {
			c := ops.DefaultAdamW
			c.Beta2 = 1
			return s.e.AdamW([]*tensor.Tensor{w}, []*tensor.Tensor{f(5, 3)}, []*tensor.Tensor{f(5, 3)}, []*tensor.Tensor{f(5, 3)}, step, c)
		}},
		{"sgd mom dtype", tensor.ErrDType, func() error {
			return s.e.SGD([]*tensor.Tensor{w}, []*tensor.Tensor{f(5, 3)}, []*tensor.Tensor{i(5, 3)}, ops.SGDConfig{LR: 0.1})
		}},
		{"argmax out dtype", tensor.ErrDType, func() error { return s.e.Argmax(f(4), y) }},
		{"argmax out shape", tensor.ErrShape, func() error { return s.e.Argmax(i(5), y) }},
		{"fill dtype", tensor.ErrDType, func() error { return s.e.Fill(Empty(t, s.a, tensor.U8, 3), 0) }},
		{"fill i32 fraction", exec.ErrConfig, func() error { return s.e.Fill(i(3), 0.5) }},
		{"fill strided", tensor.ErrLayout, func() error { return s.e.Fill(transposed, 0) }},
	}
	for _, c := range cases {
		err := c.run()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.want)
		}
	}
	// A rejected call writes nothing.
	for _, v := range Download(t, y) {
		if !math.IsNaN(v) {
			t.Fatalf("a rejected Linear wrote its output")
		}
	}
}
