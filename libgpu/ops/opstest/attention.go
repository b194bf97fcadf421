package opstest

import (
	"fmt"
	"math"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "attention", Check: checkAttention}) }

// AttnShape is the geometry of an attention call: q [B,Tq,H,D], k and v
// [B,Tk,H,D].
type AttnShape struct{ B, Tq, Tk, H, D int }

func (a AttnShape) String() string {
	return fmt.Sprintf("B%d,Tq%d,Tk%d,H%d,D%d", a.B, a.Tq, a.Tk, a.H, a.D)
}

// at is the row-major offset of [b, t, h, 0] in a [B,T,H,D] tensor.
func (a AttnShape) at(t, b, i, h int) int { return ((b*t+i)*a.H + h) * a.D }

// RefAttention is the float64 reference of ops.Engine.AttentionForward:
// the naive softmax(q·kᵀ·scale + mask)·v with every score materialised,
// for row-major q [B,Tq,H,D], k and v [B,Tk,H,D]; lse [B,H,Tq]. causal
// masks key j > query i.
func RefAttention(q, k, v []float64, a AttnShape, causal bool, scale float64) (o, lse []float64) {
	o = make([]float64, a.B*a.Tq*a.H*a.D)
	lse = make([]float64, a.B*a.H*a.Tq)
	s := make([]float64, a.Tk)
	for b := 0; b < a.B; b++ {
		for h := 0; h < a.H; h++ {
			for i := 0; i < a.Tq; i++ {
				m := math.Inf(-1)
				for j := 0; j < a.Tk; j++ {
					s[j] = math.Inf(-1)
					if !causal || j <= i {
						var dot float64
						for d := 0; d < a.D; d++ {
							dot += q[a.at(a.Tq, b, i, h)+d] * k[a.at(a.Tk, b, j, h)+d]
						}
						s[j] = dot * scale
					}
					m = math.Max(m, s[j])
				}
				var l float64
				for j := range s {
					s[j] = math.Exp(s[j] - m)
					l += s[j]
				}
				lse[(b*a.H+h)*a.Tq+i] = m + math.Log(l)
				for d := 0; d < a.D; d++ {
					var acc float64
					for j := range s {
						acc += s[j] / l * v[a.at(a.Tk, b, j, h)+d]
					}
					o[a.at(a.Tq, b, i, h)+d] = acc
				}
			}
		}
	}
	return o, lse
}

// RefAttentionBackward is the float64 gradient of L = Σ do·o for
// RefAttention's o with respect to q, k and v (exact softmax Jacobian:
// dS = P∘(dP − rowsum(P∘dP)), dP = do·vᵀ).
func RefAttentionBackward(do, q, k, v []float64, a AttnShape, causal bool, scale float64) (dq, dk, dv []float64) {
	dq = make([]float64, len(q))
	dk = make([]float64, len(k))
	dv = make([]float64, len(v))
	p := make([]float64, a.Tk)
	dp := make([]float64, a.Tk)
	dot := func(x []float64, xi int, y []float64, yi int) float64 {
		var s float64
		for d := 0; d < a.D; d++ {
			s += x[xi+d] * y[yi+d]
		}
		return s
	}
	for b := 0; b < a.B; b++ {
		for h := 0; h < a.H; h++ {
			for i := 0; i < a.Tq; i++ {
				qi := a.at(a.Tq, b, i, h)
				m := math.Inf(-1)
				for j := 0; j < a.Tk; j++ {
					p[j] = math.Inf(-1)
					if !causal || j <= i {
						p[j] = scale * dot(q, qi, k, a.at(a.Tk, b, j, h))
					}
					m = math.Max(m, p[j])
				}
				var l, delta float64
				for j := range p {
					p[j] = math.Exp(p[j] - m)
					l += p[j]
				}
				for j := range p {
					p[j] /= l
					dp[j] = dot(do, qi, v, a.at(a.Tk, b, j, h))
					delta += p[j] * dp[j]
				}
				for j := range p {
					ds := p[j] * (dp[j] - delta)
					kj := a.at(a.Tk, b, j, h)
					for d := 0; d < a.D; d++ {
						dq[qi+d] += scale * ds * k[kj+d]
						dk[kj+d] += scale * ds * q[qi+d]
						dv[kj+d] += p[j] * do[qi+d]
					}
				}
			}
		}
	}
	return dq, dk, dv
}

// attnCase is a forward/backward check configuration.
type attnCase struct {
	a      AttnShape
	causal bool
}

func checkAttention(s *Suite) {
	cases := []attnCase{
		{AttnShape{1, 1, 1, 1, 8}, false},
		{AttnShape{1, 1, 1, 1, 64}, true},   // T = 1 on the tensor-core path (bf16)
		{AttnShape{2, 17, 17, 3, 16}, true}, // T not a multiple of any tile
		{AttnShape{2, 17, 17, 3, 16}, false},
		{AttnShape{1, 5, 19, 2, 32}, false},  // Tq ≠ Tk
		{AttnShape{1, 70, 70, 2, 64}, true},  // two 64-row tiles, the second partial
		{AttnShape{1, 33, 33, 1, 128}, true}, // D = 128
		{AttnShape{1, 9, 23, 1, 128}, false},
		{AttnShape{2, 21, 21, 2, 40}, true}, // a D the tensor cores do not take
	}
	for _, dt := range s.DTypes() {
		for _, c := range cases {
			s.Run(fmt.Sprintf("%v/%v/causal=%v", dt, c.a, c.causal), func(s *Suite) { attnForwardBackward(s, dt, c) })
		}
		s.Run(fmt.Sprintf("%v/misaligned", dt), func(s *Suite) {
			attnForwardBackward(s, dt, attnCase{AttnShape{1, 20, 20, 2, 64}, true}, 3)
		})
		for _, g := range []struct {
			b, t, h, d int
			causal     bool
		}{{2, 5, 2, 4, true}, {2, 5, 2, 4, false}, {1, 6, 1, 64, true}} {
			s.Run(fmt.Sprintf("%v/self-attention-grad/B%d,T%d,H%d,D%d,causal=%v", dt, g.b, g.t, g.h, g.d, g.causal),
				func(s *Suite) { selfAttentionGrad(s, dt, g.b, g.t, g.h, g.d, g.causal) })
		}
		s.Run(fmt.Sprintf("%v/decode", dt), func(s *Suite) { attnDecode(s, dt) })
	}
	s.Run("validation", attnValidation)
}

// attnInputs makes q, k, v as strided views: for Tq = Tk, the three parts
// of a fused qkv [B,T,3,H,D] with pad extra elements per row (and an
// offset of pad elements); otherwise q from a [B,Tq,H·D+pad] tensor and
// k, v from one [B,Tk,2·H·D+pad]. It returns the views, their values
// (row-major [B,T,H,D], as stored) and the buffer that holds them all.
func attnInputs(s *Suite, dt tensor.DType, a AttnShape, pad int) (q, k, v *tensor.Tensor, qv, kv, vv []float64) {
	hd := a.H * a.D
	part := func(x *tensor.Tensor, xv []float64, t, row, col int) (*tensor.Tensor, []float64) {
		n, err := x.Narrow(2, col, hd)
		s.NoErr("narrow", err)
		p, err := n.View(a.B, t, a.H, a.D)
		s.NoErr("view", err)
		out := make([]float64, 0, a.B*t*hd)
		for r := 0; r < a.B*t; r++ {
			out = append(out, xv[r*row+col:r*row+col+hd]...)
		}
		return p, out
	}
	if a.Tq == a.Tk {
		row := 3*hd + pad
		x, xv := s.Rand(dt, 1, a.B, a.Tq, row)
		q, qv = part(x, xv, a.Tq, row, pad)
		k, kv = part(x, xv, a.Tk, row, pad+hd)
		v, vv = part(x, xv, a.Tk, row, pad+2*hd)
		return
	}
	xq, xqv := s.Rand(dt, 1, a.B, a.Tq, hd+pad)
	xk, xkv := s.Rand(dt, 1, a.B, a.Tk, 2*hd+pad)
	q, qv = part(xq, xqv, a.Tq, hd+pad, pad)
	k, kv = part(xk, xkv, a.Tk, 2*hd+pad, 0)
	v, vv = part(xk, xkv, a.Tk, 2*hd+pad, hd+pad)
	return
}

// attnGrads makes poisoned gradient views shaped like q, k, v (the parts of
// one fused buffer when Tq = Tk, as SelfAttention's backward writes them),
// and the buffer that must stay poisoned outside them.
func attnGrads(s *Suite, dt tensor.DType, a AttnShape, pad int) (dq, dk, dv, whole *tensor.Tensor) {
	hd := a.H * a.D
	part := func(x *tensor.Tensor, t, col int) *tensor.Tensor {
		n, err := x.Narrow(2, col, hd)
		s.NoErr("narrow", err)
		p, err := n.View(a.B, t, a.H, a.D)
		s.NoErr("view", err)
		return p
	}
	if a.Tq == a.Tk {
		whole = s.Empty(dt, a.B, a.Tq, 3*hd+pad)
		return part(whole, a.Tq, pad), part(whole, a.Tk, pad+hd), part(whole, a.Tk, pad+2*hd), whole
	}
	return s.Empty(dt, a.B, a.Tq, a.H, a.D), s.Empty(dt, a.B, a.Tk, a.H, a.D), s.Empty(dt, a.B, a.Tk, a.H, a.D), nil
}

// attnForwardBackward: the forward against RefAttention with o and lse
// poisoned first; the backward (written, then accumulated, then with dk
// not wanted) against RefAttentionBackward; nothing outside the gradient
// views written. padding (default 8) is the extra elements per row of the
// fused buffers (3 misaligns the rows: the CUDA-core path on bf16).
func attnForwardBackward(s *Suite, dt tensor.DType, c attnCase, padding ...int) {
	a := c.a
	pad := 8
	if len(padding) > 0 {
		pad = padding[0]
	}
	scale := 1 / math.Sqrt(float64(a.D))
	q, k, v, qv, kv, vv := attnInputs(s, dt, a, pad)
	o := s.Empty(dt, a.B, a.Tq, a.H, a.D)
	lse := s.Empty(tensor.F32, a.B, a.H, a.Tq)
	s.NoErr("forward", s.E.AttentionForward(o, lse, q, k, v, c.causal, float32(scale)))
	wantO, wantL := RefAttention(qv, kv, vv, a, c.causal, scale)
	s.Near("o", s.Read(o), wantO, s.Tol(dt))
	s.Near("lse", s.Read(lse), wantL, s.Tol(tensor.F32))

	do, dov := s.Rand(dt, 1, a.B, a.Tq, a.H, a.D)
	wq, wk, wv := RefAttentionBackward(dov, qv, kv, vv, a, c.causal, scale)
	// The kernels use the stored o (rounded to dt) for δ: bf16 gradients
	// carry that rounding too.
	tol := s.Tol(dt)
	if dt == tensor.BF16 {
		tol *= 2
	}
	dq, dk, dv, whole := attnGrads(s, dt, a, pad)
	s.NoErr("backward", s.E.AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, c.causal, float32(scale), [3]bool{}))
	gq, gk, gv := s.Read(dq), s.Read(dk), s.Read(dv)
	s.Near("dq", gq, wq, tol)
	s.Near("dk", gk, wk, tol)
	s.Near("dv", gv, wv, tol)
	if whole != nil {
		hd := a.H * a.D
		all := s.Read(whole)
		for r := 0; r < a.B*a.Tq; r++ {
			for col := 0; col < pad; col++ {
				if x := all[r*(3*hd+pad)+col]; !math.IsNaN(x) {
					s.T.Fatalf("row %d column %d outside dq, dk, dv was written (%v)", r, col, x)
				}
			}
		}
	}
	// Accumulate: dq and dv add to what they hold (random values); dk not
	// wanted.
	prefill := func(x *tensor.Tensor) []float64 {
		s.NoErr("prefill", x.WriteFloat32(F32(s.Weights(x.Numel()))))
		return s.Read(x)
	}
	oldQ, oldV := prefill(dq), prefill(dv)
	s.NoErr("backward (acc)", s.E.AttentionBackward(dq, nil, dv, do, q, k, v, o, lse, c.causal, float32(scale), [3]bool{true, false, true}))
	sum := func(x, y []float64) []float64 {
		out := make([]float64, len(x))
		for i := range x {
			out[i] = x[i] + y[i]
		}
		return out
	}
	s.Near("dq (accumulated)", s.Read(dq), sum(oldQ, wq), tol)
	s.Near("dv (accumulated)", s.Read(dv), sum(oldV, wv), tol)
	if got := s.Read(dk); RelErr(got, gk) != 0 {
		s.T.Errorf("dk changed though not wanted (relative change %.3g)", RelErr(got, gk))
	}
}

// selfAttentionGrad checks Graph.SelfAttention against the float64
// reference and finite differences, fan-out included (Twice).
func selfAttentionGrad(s *Suite, dt tensor.DType, b, t, h, d int, causal bool) {
	a := AttnShape{b, t, t, h, d}
	c := h * d
	split := func(x []float64) (q, k, v []float64) {
		for r := 0; r < b*t; r++ {
			row := x[r*3*c : (r+1)*3*c]
			q, k, v = append(q, row[:c]...), append(k, row[c:2*c]...), append(v, row[2*c:]...)
		}
		return
	}
	tolF := s.Tol(dt)
	s.GradCheck(GradCase{
		Name: fmt.Sprintf("self-attention %v causal=%v", a, causal), DType: dt,
		Params: [][]int{{b, t, 3 * c}}, Twice: true, TolF: tolF, TolB: 10 * tolF,
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.SelfAttention(p[0], h, causal) },
		Ref: func(p [][]float64) []float64 {
			q, k, v := split(p[0])
			o, _ := RefAttention(q, k, v, a, causal, 1/math.Sqrt(float64(d)))
			return o
		},
	})
}

// attnDecode: KVWrite puts a step's k and v (views of a fused qkv step) at
// pos; AttentionDecode attends to keys 0..pos and reads nothing past them
// (the cache rows past pos are NaN).
func attnDecode(s *Suite, dt tensor.DType) {
	for _, c := range []struct{ b, tmax, h, d, pos int }{{2, 9, 3, 24, 0}, {1, 40, 2, 64, 17}, {2, 20, 1, 128, 19}} {
		hd := c.h * c.d
		a := AttnShape{c.b, 1, c.pos + 1, c.h, c.d}
		step, stepv := s.Rand(dt, 1, c.b, 1, 3*hd)
		views := make([]*tensor.Tensor, 3)
		vals := make([][]float64, 3)
		for i := range views {
			n, err := step.Narrow(2, i*hd, hd)
			s.NoErr("narrow", err)
			views[i], err = n.View(c.b, 1, c.h, c.d)
			s.NoErr("view", err)
			for r := 0; r < c.b; r++ {
				vals[i] = append(vals[i], stepv[r*3*hd+i*hd:r*3*hd+(i+1)*hd]...)
			}
		}
		kc, vc := s.Empty(dt, c.b, c.tmax, c.h, c.d), s.Empty(dt, c.b, c.tmax, c.h, c.d)
		// rows before pos: earlier steps
		prev := make([][]float64, 2)
		for i, cache := range []*tensor.Tensor{kc, vc} {
			if c.pos == 0 {
				continue
			}
			rows, err := cache.Narrow(1, 0, c.pos)
			s.NoErr("narrow", err)
			src, sv := s.Rand(dt, 1, c.b, c.pos, c.h, c.d)
			sr, err := src.ReadFloat32()
			s.NoErr("read", err)
			s.NoErr("write", rows.WriteFloat32(sr))
			prev[i] = sv
		}
		pos := UploadI32(s.T, s.A, []int32{int32(c.pos)}, 1)
		s.NoErr("kv write k", s.E.KVWrite(kc, views[1], pos))
		s.NoErr("kv write v", s.E.KVWrite(vc, views[2], pos))
		o := s.Empty(dt, c.b, 1, c.h, c.d)
		scale := 1 / math.Sqrt(float64(c.d))
		s.NoErr("decode", s.E.AttentionDecode(o, views[0], kc, vc, pos, float32(scale)))
		// reference keys: rows 0..pos-1 from prev, row pos from the step
		keys := func(i int) []float64 {
			var out []float64
			for b := 0; b < c.b; b++ {
				if c.pos > 0 {
					out = append(out, prev[i][b*c.pos*hd:(b+1)*c.pos*hd]...)
				}
				out = append(out, vals[i+1][b*hd:(b+1)*hd]...)
			}
			return out
		}
		want, _ := RefAttention(vals[0], keys(0), keys(1), a, false, scale)
		s.Near(fmt.Sprintf("decode B%d Tmax%d H%d D%d pos%d", c.b, c.tmax, c.h, c.d, c.pos), s.Read(o), want, s.Tol(dt))
		// The cache row at pos is the step's k exactly; rows past pos untouched.
		got := s.Read(kc)
		for b := 0; b < c.b; b++ {
			for t := c.pos; t < c.tmax; t++ {
				row := got[(b*c.tmax+t)*hd : (b*c.tmax+t+1)*hd]
				for j, x := range row {
					if t == c.pos && x != vals[1][b*hd+j] {
						s.T.Fatalf("k cache [%d,%d] element %d = %v, want %v", b, t, j, x, vals[1][b*hd+j])
					}
					if t > c.pos && !math.IsNaN(x) {
						s.T.Fatalf("k cache row %d past pos %d was written", t, c.pos)
					}
				}
			}
		}
	}
	// A position past the cache writes nothing.
	kc := s.Empty(dt, 1, 4, 1, 8)
	x, _ := s.Rand(dt, 1, 1, 1, 1, 8)
	s.NoErr("kv write past the end", s.E.KVWrite(kc, x, UploadI32(s.T, s.A, []int32{4}, 1)))
	for _, v := range s.Read(kc) {
		if !math.IsNaN(v) {
			s.T.Fatal("KVWrite with pos = Tmax wrote into the cache")
		}
	}
}

func attnValidation(s *Suite) {
	f := func(shape ...int) *tensor.Tensor { return s.Empty(tensor.F32, shape...) }
	q, k, v, o := f(2, 5, 3, 8), f(2, 5, 3, 8), f(2, 5, 3, 8), f(2, 5, 3, 8)
	lse := f(2, 3, 5)
	bad := []struct {
		what string
		err  error
	}{
		{"rank-3 q", s.E.AttentionForward(o, lse, f(2, 5, 24), k, v, false, 1)},
		{"k of another head dimension", s.E.AttentionForward(o, lse, q, f(2, 5, 3, 4), v, false, 1)},
		{"v of another length", s.E.AttentionForward(o, lse, q, k, f(2, 6, 3, 8), false, 1)},
		{"mixed dtypes", s.E.AttentionForward(o, lse, q, s.Empty(tensor.BF16, 2, 5, 3, 8), v, false, 1)},
		{"o of another dtype", s.E.AttentionForward(s.Empty(tensor.BF16, 2, 5, 3, 8), lse, q, k, v, false, 1)},
		{"o of another shape", s.E.AttentionForward(f(2, 5, 3, 4), lse, q, k, v, false, 1)},
		{"lse of another shape", s.E.AttentionForward(o, f(2, 5, 3), q, k, v, false, 1)},
		{"bf16 lse", s.E.AttentionForward(o, s.Empty(tensor.BF16, 2, 3, 5), q, k, v, false, 1)},
		{"causal with Tq ≠ Tk", s.E.AttentionForward(f(2, 4, 3, 8), f(2, 3, 4), f(2, 4, 3, 8), k, v, true, 1)},
		{"D > 128", s.E.AttentionForward(f(1, 2, 1, 129), f(1, 1, 2), f(1, 2, 1, 129), f(1, 2, 1, 129), f(1, 2, 1, 129), false, 1)},
		{"NaN scale", s.E.AttentionForward(o, lse, q, k, v, false, float32(math.NaN()))},
		{"no keys", s.E.AttentionForward(o, lse, q, f(2, 0, 3, 8), f(2, 0, 3, 8), false, 1)},
		{"backward without lse", s.E.AttentionBackward(q, k, v, o, q, k, v, o, nil, false, 1, [3]bool{})},
		{"backward dq of another shape", s.E.AttentionBackward(f(2, 5, 3, 4), k, v, o, q, k, v, o, lse, false, 1, [3]bool{})},
		{"backward do missing", s.E.AttentionBackward(q, k, v, nil, q, k, v, o, lse, false, 1, [3]bool{})},
		{"decode of two queries", s.E.AttentionDecode(f(2, 2, 3, 8), f(2, 2, 3, 8), k, v, UploadI32(s.T, s.A, []int32{0}, 1), 1)},
		{"decode with an f32 position", s.E.AttentionDecode(f(2, 1, 3, 8), f(2, 1, 3, 8), k, v, f(1), 1)},
		{"decode with two positions", s.E.AttentionDecode(f(2, 1, 3, 8), f(2, 1, 3, 8), k, v, UploadI32(s.T, s.A, []int32{0, 1}, 2), 1)},
		{"kv write of two steps", s.E.KVWrite(k, f(2, 2, 3, 8), UploadI32(s.T, s.A, []int32{0}, 1))},
		{"kv write of another dtype", s.E.KVWrite(k, s.Empty(tensor.BF16, 2, 1, 3, 8), UploadI32(s.T, s.A, []int32{0}, 1))},
	}
	for _, c := range bad {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
	tr, _ := f(2, 5, 8, 3).Transpose(2, 3) // last dimension strided
	if err := s.E.AttentionForward(o, lse, tr, k, v, false, 1); err == nil {
		s.T.Error("q with a strided last dimension was accepted")
	}
	// SelfAttention: qkv's last dimension must split into 3·heads parts.
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{})
	defer g.Free()
	x := g.Param("qkv", f(2, 5, 24), f(2, 5, 24))
	if y := g.SelfAttention(x, 5, true); y != nil || g.Err() == nil {
		s.T.Error("SelfAttention with 24 columns and 5 heads was accepted")
	}
}
