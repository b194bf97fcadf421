package opstest

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// ChainShapes are the (M, K, N) shapes of the chained backward checks:
// Shapes (tiny, odd, not multiples of 8, where the CUDA backend takes its
// unfused paths for GELU) plus shapes whose K is a multiple of 8 (DGELU's
// aux leading dimension) and more than one 128-bit word of ReLU mask per row.
var ChainShapes = append(append([][3]int(nil), Shapes...), [3]int{64, 136, 40}, [3]int{33, 256, 24})

// prevAct is how the previous layer's activation reaches the chained backward.
type prevAct struct {
	act  ops.Act
	mask bool // ReLU: the u8 bit-mask rather than nil (x > 0)
}

func (p prevAct) String() string {
	if p.mask {
		return p.act.String() + "+mask"
	}
	return p.act.String()
}

var prevActs = []prevAct{{ops.ActNone, false}, {ops.ActReLU, true}, {ops.ActReLU, false}, {ops.ActGELU, false}}

// checkChainSupport runs the chain checks when the backend has them and
// otherwise checks that the engine says so with ErrNoBackend.
func (s *suite) checkChainSupport(t *testing.T) bool {
	if s.e.HasLinearChain() {
		return true
	}
	f := func(shape ...int) *tensor.Tensor { return Empty(t, s.a, tensor.F32, shape...) }
	err := s.e.LinearBackwardChain(nil, f(5, 3), nil, nil, f(4, 5), f(4, 3), f(5, 3), nil, ops.ActNone)
	if !errors.Is(err, exec.ErrNoBackend) {
		t.Fatalf("backend without LinearChainer: LinearBackwardChain error %v, want ErrNoBackend", err)
	}
	return false
}

// maskBitsMatch compares a device ReLU mask with the reference bit by bit
// for j < n, skipping elements whose reference z is within margin of 0 (the
// device computes z at its own precision). It reports the first mismatch.
func maskBitsMatch(got, want []uint8, z []float64, m, n int, margin float64) error {
	ld := ops.ReLUMaskCols(n)
	if len(got) != m*ld {
		return fmt.Errorf("mask has %d bytes, want %d", len(got), m*ld)
	}
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			if math.Abs(z[i*n+j]) < margin {
				continue
			}
			g := got[i*ld+j/8] >> (j % 8) & 1
			w := want[i*ld+j/8] >> (j % 8) & 1
			if g != w {
				return fmt.Errorf("mask bit [%d,%d] = %d, want %d (z = %.4g; byte %#02x, want %#02x)", i, j, g, w, z[i*n+j], got[i*ld+j/8], want[i*ld+j/8])
			}
		}
	}
	return nil
}

// linearReLUMask: Linear with a u8 aux writes y = relu(z) and the ReLU
// bit-mask of z > 0 in the layout of ops.ReLUMaskCols.
func (s *suite) linearReLUMask(t *testing.T) {
	if !s.checkChainSupport(t) {
		return
	}
	for _, sh := range ChainShapes {
		m, k, n := sh[0], sh[1], sh[2]
		for _, bias := range []bool{false, true} {
			name := fmt.Sprintf("%dx%dx%d/bias=%v", m, k, n, bias)
			x, xf := s.rnd(t, m, k)
			w, wf := s.rnd(t, n, k)
			var b *tensor.Tensor
			var bf []float64
			if bias {
				b, bf = s.rnd(t, n)
			}
			y := Empty(t, s.a, tensor.F32, m, n)
			mask := Empty(t, s.a, tensor.U8, m, ops.ReLUMaskCols(n))
			if err := s.e.Linear(y, x, w, b, mask, ops.ActReLU); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			wantY, z := LinearRef(xf, wf, bf, m, k, n, ops.ActReLU)
			// A ReLU output near 0 cancels: its error follows the terms,
			// Σ|x||w| + |b| (a 1×1×1 bf16 y failed at 0.0192 against |y|).
			mag, _ := LinearRef(Abs(xf), Abs(wf), Abs(bf), m, k, n, ops.ActNone)
			Close(t, name+" y", Download(t, y), wantY, mag, s.tol)
			// z's rounding at the precision under test grows with √K.
			margin := max(1e-3, 5*s.tol) * max(1, math.Sqrt(float64(k))/3)
			if err := maskBitsMatch(DownloadU8(t, mask), ReLUMaskRef(z, m, n), z, m, n, margin); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}

// linearChain checks LinearBackwardChain against LinearBackwardChainRef
// for every previous activation (ReLU with its bit-mask and with x alone)
// and with every optional output present or absent.
func (s *suite) linearChain(t *testing.T) {
	if !s.checkChainSupport(t) {
		return
	}
	type variant struct{ dx, db, dbPrev bool }
	for _, sh := range ChainShapes {
		m, k, n := sh[0], sh[1], sh[2]
		for _, pa := range prevActs {
			for _, v := range []variant{{true, true, true}, {true, false, false}, {false, true, false}} {
				name := fmt.Sprintf("%dx%dx%d/%v/dx=%v,db=%v,dbPrev=%v", m, k, n, pa, v.dx, v.db, v.dbPrev)
				_, zf := s.rnd(t, m, k) // z_prev, on the host only
				xf := make([]float64, len(zf))
				for i, z := range zf {
					xf[i] = ActRef(pa.act, z)
				}
				x := Upload(t, s.a, F32(xf), m, k)
				xf = F64(F32(xf))
				w, wf := s.rnd(t, n, k)
				dz, dzf := s.rnd(t, m, n)
				var aux *tensor.Tensor
				switch {
				case pa.act == ops.ActGELU:
					aux = Upload(t, s.a, F32(zf), m, k)
				case pa.mask:
					aux = UploadU8(t, s.a, ReLUMaskRef(zf, m, k), m, ops.ReLUMaskCols(k))
				}
				dw := Empty(t, s.a, tensor.F32, n, k)
				var dx, db, dbPrev *tensor.Tensor
				if v.dx {
					dx = Empty(t, s.a, tensor.F32, m, k)
				}
				if v.db {
					db = Empty(t, s.a, tensor.F32, n)
				}
				if v.dbPrev {
					dbPrev = Empty(t, s.a, tensor.F32, k)
				}
				if err := s.e.LinearBackwardChain(dx, dw, db, dbPrev, dz, x, w, aux, pa.act); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				wdx, wdw, wdb, wdbPrev := LinearBackwardChainRef(dzf, xf, wf, zf, m, k, n, pa.act)
				// The terms: the same sums of |dz|, |x|, |w|, the previous
				// activation's derivative taken as 1 (a TF32 dbPrev over 3 rows
				// cancelled to 3.5e-3 of itself on an H100).
				tdx, tdw, tdb, tdbPrev := LinearBackwardChainRef(Abs(dzf), Abs(xf), Abs(wf), zf, m, k, n, ops.ActNone)
				Close(t, name+" dw", Download(t, dw), wdw, tdw, s.tol)
				if v.db {
					Close(t, name+" db", Download(t, db), wdb, tdb, s.tol)
				}
				if v.dx {
					Close(t, name+" dxPrev", Download(t, dx), wdx, tdx, s.tol)
				}
				if v.dbPrev {
					Close(t, name+" dbPrev", Download(t, dbPrev), wdbPrev, tdbPrev, s.tol)
				}
			}
		}
	}
}

// linearChainGradFD runs two layers the way nn.MLP does — Linear with the
// aux LinearBackwardChain wants (ReLU bit-mask, GELU z), a Linear without
// activation, then the chained backward of each — and compares every
// parameter gradient with central differences of
// L = Σ dy ⊙ (act(x·w1ᵀ + b1)·w2ᵀ + b2) in float64.
func (s *suite) linearChainGradFD(t *testing.T) {
	if !s.checkChainSupport(t) {
		return
	}
	for _, sh := range [][4]int{{3, 5, 4, 3}, {6, 9, 16, 5}} {
		m, k, h, n := sh[0], sh[1], sh[2], sh[3]
		for _, act := range acts {
			name := fmt.Sprintf("%dx%dx%dx%d/%v", m, k, h, n, act)
			var x, w1, b1 *tensor.Tensor
			var xf, w1f, b1f []float64
			for kink := true; kink; { // keep every z1 away from ReLU's kink (see linearGradFD)
				x, xf = s.rnd(t, m, k)
				w1, w1f = s.rnd(t, h, k)
				b1, b1f = s.rnd(t, h)
				_, z := LinearRef(xf, w1f, b1f, m, k, h, act)
				margin := max(1e-3, 5*s.tol)
				kink = slices.ContainsFunc(z, func(v float64) bool { return math.Abs(v) < margin })
			}
			w2, w2f := s.rnd(t, n, h)
			b2, b2f := s.rnd(t, n)
			dy, dyf := s.rnd(t, m, n)
			var aux *tensor.Tensor
			switch act {
			case ops.ActReLU:
				aux = Empty(t, s.a, tensor.U8, m, ops.ReLUMaskCols(h))
			case ops.ActGELU:
				aux = Empty(t, s.a, tensor.F32, m, h)
			}
			y1 := Empty(t, s.a, tensor.F32, m, h)
			y2 := Empty(t, s.a, tensor.F32, m, n)
			dz1 := Empty(t, s.a, tensor.F32, m, h)
			dw1, db1 := Empty(t, s.a, tensor.F32, h, k), Empty(t, s.a, tensor.F32, h)
			dw2, db2 := Empty(t, s.a, tensor.F32, n, h), Empty(t, s.a, tensor.F32, n)
			// With no activation in between, layer 1 sums its own db.
			dbPrev, db1Own := db1, (*tensor.Tensor)(nil)
			if act == ops.ActNone {
				dbPrev, db1Own = nil, db1
			}
			for _, step := range []func() error{
				func() error { return s.e.Linear(y1, x, w1, b1, aux, act) },
				func() error { return s.e.Linear(y2, y1, w2, b2, nil, ops.ActNone) },
				func() error { return s.e.LinearBackwardChain(dz1, dw2, db2, dbPrev, dy, y1, w2, aux, act) },
				func() error { return s.e.LinearBackwardChain(nil, dw1, db1Own, nil, dz1, x, w1, nil, ops.ActNone) },
			} {
				if err := step(); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
			}
			loss := func([]float64) float64 {
				a, _ := LinearRef(xf, w1f, b1f, m, k, h, act)
				o, _ := LinearRef(a, w2f, b2f, m, h, n, ops.ActNone)
				var l float64
				for i := range o {
					l += o[i] * dyf[i]
				}
				return l
			}
			// The terms: layer 2's gradients sum |dy| with |y1|; dz1 sums
			// |dy|·|w2| (the activation's derivative taken as 1), and layer
			// 1's gradients sum those with |x|.
			y1f, z1f := LinearRef(xf, w1f, b1f, m, k, h, act)
			tdz1, tdw2, tdb2 := LinearBackwardRef(Abs(dyf), Abs(y1f), Abs(w2f), make([]float64, m*n), m, h, n, ops.ActNone)
			_, tdw1, tdb1 := LinearBackwardRef(tdz1, Abs(xf), Abs(w1f), z1f, m, k, h, ops.ActNone)
			// Layer 1's gradients come from operands rounded twice (dy and w2
			// for dz1, then dz1 and x): under reduced precision, twice the
			// one-GEMM tolerance.
			deep := s.tol
			if s.tol > 1e-4 {
				deep = 2 * s.tol
			}
			const eps = 1e-6
			Close(t, name+" dw1", Download(t, dw1), FiniteDiff(loss, w1f, eps), tdw1, deep)
			Close(t, name+" db1", Download(t, db1), FiniteDiff(loss, b1f, eps), tdb1, deep)
			Close(t, name+" dw2", Download(t, dw2), FiniteDiff(loss, w2f, eps), tdw2, s.tol)
			Close(t, name+" db2", Download(t, db2), FiniteDiff(loss, b2f, eps), tdb2, s.tol)
		}
	}
}

// chainValidation: the engine rejects malformed chained calls and u8 aux
// misuse before any backend runs.
func (s *suite) chainValidation(t *testing.T) {
	if !s.checkChainSupport(t) {
		return
	}
	f := func(shape ...int) *tensor.Tensor { return Empty(t, s.a, tensor.F32, shape...) }
	u := func(shape ...int) *tensor.Tensor { return Empty(t, s.a, tensor.U8, shape...) }
	x, w, dz, dw := f(4, 3), f(5, 3), f(4, 5), f(5, 3)
	cases := []struct {
		name string
		want error
		run  func() error
	}{
		{"dbPrev without dxPrev", tensor.ErrShape, func() error {
			return s.e.LinearBackwardChain(nil, dw, nil, f(3), dz, x, w, nil, ops.ActReLU)
		}},
		{"gelu without z_prev", tensor.ErrShape, func() error {
			return s.e.LinearBackwardChain(f(4, 3), dw, nil, nil, dz, x, w, nil, ops.ActGELU)
		}},
		{"mask width", tensor.ErrShape, func() error {
			return s.e.LinearBackwardChain(f(4, 3), dw, nil, nil, dz, x, w, u(4, 3), ops.ActReLU)
		}},
		{"f32 mask", tensor.ErrDType, func() error {
			return s.e.LinearBackwardChain(f(4, 3), dw, nil, nil, dz, x, w, f(4, 16), ops.ActReLU)
		}},
		{"dbPrev shape", tensor.ErrShape, func() error {
			return s.e.LinearBackwardChain(f(4, 3), dw, nil, f(5), dz, x, w, nil, ops.ActNone)
		}},
		{"dz shape", tensor.ErrShape, func() error {
			return s.e.LinearBackwardChain(nil, dw, nil, nil, f(5, 4), x, w, nil, ops.ActNone)
		}},
		{"bad act", ops.ErrConfig, func() error {
			return s.e.LinearBackwardChain(nil, dw, nil, nil, dz, x, w, nil, ops.Act(9))
		}},
		{"linear mask with gelu", tensor.ErrDType, func() error {
			return s.e.Linear(f(4, 5), x, w, nil, u(4, 16), ops.ActGELU)
		}},
		{"linear mask width", tensor.ErrShape, func() error {
			return s.e.Linear(f(4, 5), x, w, nil, u(4, 5), ops.ActReLU)
		}},
	}
	for _, c := range cases {
		if err := c.run(); !errors.Is(err, c.want) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.want)
		}
	}
	for _, v := range Download(t, dw) {
		if !math.IsNaN(v) {
			t.Fatalf("a rejected LinearBackwardChain wrote its output")
		}
	}
}
