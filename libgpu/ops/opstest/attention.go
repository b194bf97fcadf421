package opstest

import (
	"errors"
	"fmt"
	"math"

	"gpukit/libgpu/device"
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

// AttnKeep is a dropout mask on attention probabilities: whether element
// (query i, key j) of head h of batch row b is kept.
type AttnKeep func(b, h, i, j int) bool

// RefAttnKeep is the mask of ops.AttnDropout d for a call of geometry a:
// ops.DropoutKeep of element ((d.B0 + b)·H + h)·Tq + i)·Tk + j at step
// step. nil when d.P = 0.
func RefAttnKeep(d ops.AttnDropout, step uint32, a AttnShape) AttnKeep {
	if d.P == 0 {
		return nil
	}
	return func(b, h, i, j int) bool {
		n := ((d.B0+int64(b))*int64(a.H)+int64(h))*int64(a.Tq)*int64(a.Tk) + int64(i)*int64(a.Tk) + int64(j)
		return ops.DropoutKeep(d.Seed, uint32(d.Site), step, n, d.P)
	}
}

// attnZ is the dropout factor of element (b, h, i, j): 1 without a mask,
// else m/(1−p) in float64.
func attnZ(keep AttnKeep, p float32, b, h, i, j int) float64 {
	if keep == nil {
		return 1
	}
	if !keep(b, h, i, j) {
		return 0
	}
	return 1 / (1 - float64(p))
}

// RefAttention is the float64 reference of ops.Engine.AttentionForward:
// the naive softmax(q·kᵀ·scale + mask)·v with every score materialised,
// for row-major q [B,Tq,H,D], k and v [B,Tk,H,D]; lse [B,H,Tq]. causal
// masks key j > query i.
func RefAttention(q, k, v []float64, a AttnShape, causal bool, scale float64) (o, lse []float64) {
	return RefAttentionDrop(q, k, v, a, causal, scale, nil, 0)
}

// RefAttentionDrop is RefAttention with dropout on P: o = (P∘Z)·v, Z =
// keep/(1−p) (keep nil: none); lse is the undropped one.
func RefAttentionDrop(q, k, v []float64, a AttnShape, causal bool, scale float64, keep AttnKeep, p float32) (o, lse []float64) {
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
						acc += s[j] / l * attnZ(keep, p, b, h, i, j) * v[a.at(a.Tk, b, j, h)+d]
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
	return RefAttentionBackwardDrop(do, q, k, v, a, causal, scale, nil, 0)
}

// RefAttentionBackwardDrop is RefAttentionBackward for RefAttentionDrop's
// o: the gradient of Σ_j P_ij Z_ij v_j through P, dP = Z∘(do·vᵀ).
func RefAttentionBackwardDrop(do, q, k, v []float64, a AttnShape, causal bool, scale float64, keep AttnKeep, pd float32) (dq, dk, dv []float64) {
	return RefAttentionBackwardDropO(do, nil, q, k, v, a, causal, scale, keep, pd)
}

// RefAttentionBackwardDropO is RefAttentionBackwardDrop with the row terms
// δ_i = rowsum(do_i ∘ o_i) taken from a given forward output o (laid out
// as q), as FlashAttention's backward takes them from the stored output
// (Dao 2023, Algorithm 2, line 4) — equal to Σ_j P_ij dP_ij in exact
// arithmetic. With a bf16 o whose rounding does not cancel (dropout scales
// v by 1/(1−p)), dS at T = 1, exactly 0 in exact arithmetic, is that
// rounding: a reference from the stored o checks what the kernel computes.
// o nil: δ from P and dP.
func RefAttentionBackwardDropO(do, o, q, k, v []float64, a AttnShape, causal bool, scale float64, keep AttnKeep, pd float32) (dq, dk, dv []float64) {
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
					dp[j] = attnZ(keep, pd, b, h, i, j) * dot(do, qi, v, a.at(a.Tk, b, j, h))
					delta += p[j] * dp[j]
				}
				if o != nil {
					delta = dot(do, qi, o, qi)
				}
				for j := range p {
					ds := p[j] * (dp[j] - delta)
					kj := a.at(a.Tk, b, j, h)
					pz := p[j] * attnZ(keep, pd, b, h, i, j)
					for d := 0; d < a.D; d++ {
						dq[qi+d] += scale * ds * k[kj+d]
						dk[kj+d] += scale * ds * q[qi+d]
						dv[kj+d] += pz * do[qi+d]
					}
				}
			}
		}
	}
	return dq, dk, dv
}

// attnCase is a forward/backward check configuration; drop > 0 turns on
// dropout on P (attnDrop's seed, site, step and batch offset).
type attnCase struct {
	a      AttnShape
	causal bool
	drop   float32
}

// The dropout of the attention checks: seed, call-site, step and batch
// offset (a shard's first row: the element numbering starts past 0).
const (
	attnDropSeed = 0x243f6a8885a308d3
	attnDropSite = 6
	attnDropStep = 1234
	attnDropB0   = 5
)

// attnDrop is the AttnDropout of probability p with the constants above,
// its counter allocated on s (nil for p = 0).
func attnDrop(s *Suite, p float32) ops.AttnDropout {
	if p == 0 {
		return ops.AttnDropout{}
	}
	return ops.AttnDropout{P: p, Seed: attnDropSeed, Site: attnDropSite, B0: attnDropB0,
		Counter: UploadI32(s.T, s.A, []int32{attnDropStep}, 1)}
}

func checkAttention(s *Suite) {
	cases := []attnCase{
		{AttnShape{1, 1, 1, 1, 8}, false, 0},
		{AttnShape{1, 1, 1, 1, 64}, true, 0},   // T = 1 on the tensor-core path (bf16)
		{AttnShape{2, 17, 17, 3, 16}, true, 0}, // T not a multiple of any tile
		{AttnShape{2, 17, 17, 3, 16}, false, 0},
		{AttnShape{1, 5, 19, 2, 32}, false, 0},  // Tq ≠ Tk
		{AttnShape{1, 70, 70, 2, 64}, true, 0},  // two 64-row tiles, the second partial
		{AttnShape{1, 33, 33, 1, 128}, true, 0}, // D = 128
		{AttnShape{1, 9, 23, 1, 128}, false, 0},
		{AttnShape{2, 21, 21, 2, 40}, true, 0},  // a D the tensor cores do not take
		{AttnShape{2, 82, 82, 8, 64}, false, 0}, // HRM on Sudoku: 81 cells + the puzzle token, hidden 512 / 8 heads, non-causal
	}
	for _, dt := range s.DTypes() {
		for _, c := range cases {
			s.Run(fmt.Sprintf("%v/%v/causal=%v", dt, c.a, c.causal), func(s *Suite) { attnForwardBackward(s, dt, c) })
		}
		s.Run(fmt.Sprintf("%v/misaligned", dt), func(s *Suite) {
			attnForwardBackward(s, dt, attnCase{AttnShape{1, 20, 20, 2, 64}, true, 0}, 3)
		})
		for _, g := range []struct {
			b, t, h, d int
			causal     bool
		}{{2, 5, 2, 4, true}, {2, 5, 2, 4, false}, {1, 6, 1, 64, true}} {
			s.Run(fmt.Sprintf("%v/self-attention-grad/B%d,T%d,H%d,D%d,causal=%v", dt, g.b, g.t, g.h, g.d, g.causal),
				func(s *Suite) { selfAttentionGrad(s, dt, g.b, g.t, g.h, g.d, g.causal) })
		}
		s.Run(fmt.Sprintf("%v/decode", dt), func(s *Suite) { attnDecode(s, dt) })
		s.Run(fmt.Sprintf("%v/D256", dt), func(s *Suite) { attnWide(s, dt) })
		// Dropout on P: the float64 reference with the same mask, on every
		// kernel family (CUDA cores, mma.sync D = 64 and 128; T not a
		// multiple of any tile; Tq ≠ Tk).
		for _, c := range []attnCase{
			{AttnShape{2, 17, 17, 3, 16}, true, 0.2},
			{AttnShape{1, 5, 19, 2, 32}, false, 0.2},
			{AttnShape{1, 70, 70, 2, 64}, true, 0.2},
			{AttnShape{1, 70, 70, 1, 64}, false, 0.5},
			{AttnShape{1, 33, 33, 1, 128}, true, 0.2},
			{AttnShape{1, 9, 23, 1, 128}, false, 0.2},
			{AttnShape{2, 21, 21, 2, 40}, true, 0.2},
		} {
			s.Run(fmt.Sprintf("%v/dropout=%v/%v/causal=%v", dt, c.drop, c.a, c.causal), func(s *Suite) { attnForwardBackward(s, dt, c) })
		}
		s.Run(fmt.Sprintf("%v/dropout/misaligned", dt), func(s *Suite) {
			attnForwardBackward(s, dt, attnCase{AttnShape{1, 20, 20, 2, 64}, true, 0.2}, 3)
		})
		for _, d := range []int{16, 64} {
			s.Run(fmt.Sprintf("%v/dropout/shards/D%d", dt, d), func(s *Suite) { attnDropShards(s, dt, d) })
			s.Run(fmt.Sprintf("%v/dropout/counter/D%d", dt, d), func(s *Suite) { attnDropCounter(s, dt, d) })
		}
		for _, g := range []struct {
			b, t, h, d int
			causal     bool
		}{{2, 5, 2, 4, true}, {2, 6, 1, 4, false}, {1, 6, 1, 64, true}} {
			s.Run(fmt.Sprintf("%v/self-attention-grad/dropout/B%d,T%d,H%d,D%d,causal=%v", dt, g.b, g.t, g.h, g.d, g.causal),
				func(s *Suite) { selfAttentionDropGrad(s, dt, g.b, g.t, g.h, g.d, g.causal) })
		}
		s.Run(fmt.Sprintf("%v/self-attention/dropout-sites", dt), func(s *Suite) { selfAttentionSites(s, dt) })
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

// attnLSETerms is the size of the terms each log-sum-exp sums: the largest
// score's products, scale·Σ_d |q_d·k_d| over the keys a row sees, plus
// |lse| (a row whose lse is near 0 — one key with a small score — still
// carries its score's rounding: seen 2.5e-5 of such an lse in f32).
func attnLSETerms(q, k, lse []float64, a AttnShape, causal bool, scale float64) []float64 {
	t := make([]float64, len(lse))
	for b := 0; b < a.B; b++ {
		for h := 0; h < a.H; h++ {
			for i := 0; i < a.Tq; i++ {
				r := (b*a.H+h)*a.Tq + i
				var top float64
				for j := 0; j < a.Tk; j++ {
					if causal && j > i {
						continue
					}
					var dot float64
					for d := 0; d < a.D; d++ {
						dot += math.Abs(q[a.at(a.Tq, b, i, h)+d] * k[a.at(a.Tk, b, j, h)+d])
					}
					top = max(top, dot*scale)
				}
				t[r] = top + math.Abs(lse[r])
			}
		}
	}
	return t
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
	drop := attnDrop(s, c.drop)
	keep := RefAttnKeep(drop, attnDropStep, a)
	s.NoErr("forward", s.E.AttentionForward(o, lse, q, k, v, c.causal, float32(scale), drop))
	wantO, wantL := RefAttentionDrop(qv, kv, vv, a, c.causal, scale, keep, c.drop)
	termO, _ := RefAttentionDrop(qv, kv, Abs(vv), a, c.causal, scale, keep, c.drop)
	s.Close("o", s.Read(o), wantO, termO, s.Tol(dt))
	s.Close("lse", s.Read(lse), wantL, attnLSETerms(qv, kv, wantL, a, c.causal, scale), s.Tol(tensor.F32))

	do, dov := s.Rand(dt, 1, a.B, a.Tq, a.H, a.D)
	wq, wk, wv := RefAttentionBackwardDrop(dov, qv, kv, vv, a, c.causal, scale, keep, c.drop)
	// The kernels use the stored o (rounded to dt) for δ: bf16 gradients
	// carry that rounding too.
	tol := s.Tol(dt)
	if dt == tensor.BF16 {
		tol *= 2
	}
	dq, dk, dv, whole := attnGrads(s, dt, a, pad)
	s.NoErr("backward", s.E.AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, c.causal, float32(scale), [3]bool{}, drop))
	gq, gk, gv := s.Read(dq), s.Read(dk), s.Read(dv)
	s.Close("dq", gq, wq, nil, tol)
	s.Close("dk", gk, wk, nil, tol)
	s.Close("dv", gv, wv, nil, tol)
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
	s.NoErr("backward (acc)", s.E.AttentionBackward(dq, nil, dv, do, q, k, v, o, lse, c.causal, float32(scale), [3]bool{true, false, true}, drop))
	sum := func(x, y []float64) []float64 {
		out := make([]float64, len(x))
		for i := range x {
			out[i] = x[i] + y[i]
		}
		return out
	}
	s.Close("dq (accumulated)", s.Read(dq), sum(oldQ, wq), nil, tol)
	s.Close("dv (accumulated)", s.Read(dv), sum(oldV, wv), nil, tol)
	if got := s.Read(dk); TermsErr(got, gk, nil) != 0 {
		s.T.Errorf("dk changed though not wanted (relative change %.3g)", TermsErr(got, gk, nil))
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
		Record: func(g *ops.Graph, p, _ []*ops.Var) *ops.Var { return g.SelfAttention(p[0], h, causal, 0) },
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
		s.Close(fmt.Sprintf("decode B%d Tmax%d H%d D%d pos%d", c.b, c.tmax, c.h, c.d, c.pos), s.Read(o), want, nil, s.Tol(dt))
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

// attnWide: head dimension 256 has a forward only. On the host it matches
// the float64 reference (causal, T not a multiple of any tile, two heads,
// strided views); on a GPU it runs only where a kernel takes it (bf16 on
// sm_90a with ops' attnWide on: attn_fwd_ws_d256) and else fails with
// ops.ErrConfig; the backward and decode fail with ops.ErrConfig
// everywhere.
func attnWide(s *Suite, dt tensor.DType) {
	a := AttnShape{1, 70, 70, 2, 256}
	scale := 1 / math.Sqrt(float64(a.D))
	q, k, v, qv, kv, vv := attnInputs(s, dt, a, 8)
	o := s.Empty(dt, a.B, a.Tq, a.H, a.D)
	lse := s.Empty(tensor.F32, a.B, a.H, a.Tq)
	err := s.E.AttentionForward(o, lse, q, k, v, true, float32(scale), ops.AttnDropout{})
	switch {
	case err == nil:
		wantO, wantL := RefAttention(qv, kv, vv, a, true, scale)
		termO, _ := RefAttention(qv, kv, Abs(vv), a, true, scale)
		s.Close("o", s.Read(o), wantO, termO, s.Tol(dt))
		s.Close("lse", s.Read(lse), wantL, attnLSETerms(qv, kv, wantL, a, true, scale), s.Tol(tensor.F32))
	case s.A.Device().Kind() != device.KindHost && errors.Is(err, ops.ErrConfig):
		s.T.Logf("no kernel takes D = 256 here: %v", err)
	default:
		s.T.Fatalf("forward at D = 256: %v", err)
	}
	if err := s.E.AttentionBackward(q, k, v, o, q, k, v, o, lse, true, float32(scale), [3]bool{}, ops.AttnDropout{}); !errors.Is(err, ops.ErrConfig) {
		s.T.Errorf("backward at D = 256: %v, want ops.ErrConfig", err)
	}
	one := func(x *tensor.Tensor) *tensor.Tensor {
		y, err := x.Narrow(1, 0, 1)
		s.NoErr("narrow", err)
		return y
	}
	if err := s.E.AttentionDecode(one(o), one(q), k, v, UploadI32(s.T, s.A, []int32{3}, 1), float32(scale)); !errors.Is(err, ops.ErrConfig) {
		s.T.Errorf("decode at D = 256: %v, want ops.ErrConfig", err)
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
		{"rank-3 q", s.E.AttentionForward(o, lse, f(2, 5, 24), k, v, false, 1, ops.AttnDropout{})},
		{"k of another head dimension", s.E.AttentionForward(o, lse, q, f(2, 5, 3, 4), v, false, 1, ops.AttnDropout{})},
		{"v of another length", s.E.AttentionForward(o, lse, q, k, f(2, 6, 3, 8), false, 1, ops.AttnDropout{})},
		{"mixed dtypes", s.E.AttentionForward(o, lse, q, s.Empty(tensor.BF16, 2, 5, 3, 8), v, false, 1, ops.AttnDropout{})},
		{"o of another dtype", s.E.AttentionForward(s.Empty(tensor.BF16, 2, 5, 3, 8), lse, q, k, v, false, 1, ops.AttnDropout{})},
		{"o of another shape", s.E.AttentionForward(f(2, 5, 3, 4), lse, q, k, v, false, 1, ops.AttnDropout{})},
		{"lse of another shape", s.E.AttentionForward(o, f(2, 5, 3), q, k, v, false, 1, ops.AttnDropout{})},
		{"bf16 lse", s.E.AttentionForward(o, s.Empty(tensor.BF16, 2, 3, 5), q, k, v, false, 1, ops.AttnDropout{})},
		{"causal with Tq ≠ Tk", s.E.AttentionForward(f(2, 4, 3, 8), f(2, 3, 4), f(2, 4, 3, 8), k, v, true, 1, ops.AttnDropout{})},
		{"D > 128", s.E.AttentionForward(f(1, 2, 1, 129), f(1, 1, 2), f(1, 2, 1, 129), f(1, 2, 1, 129), f(1, 2, 1, 129), false, 1, ops.AttnDropout{})},
		{"D > 256", s.E.AttentionForward(f(1, 2, 1, 512), f(1, 1, 2), f(1, 2, 1, 512), f(1, 2, 1, 512), f(1, 2, 1, 512), false, 1, ops.AttnDropout{})},
		{"NaN scale", s.E.AttentionForward(o, lse, q, k, v, false, float32(math.NaN()), ops.AttnDropout{})},
		{"no keys", s.E.AttentionForward(o, lse, q, f(2, 0, 3, 8), f(2, 0, 3, 8), false, 1, ops.AttnDropout{})},
		{"backward without lse", s.E.AttentionBackward(q, k, v, o, q, k, v, o, nil, false, 1, [3]bool{}, ops.AttnDropout{})},
		{"backward dq of another shape", s.E.AttentionBackward(f(2, 5, 3, 4), k, v, o, q, k, v, o, lse, false, 1, [3]bool{}, ops.AttnDropout{})},
		{"backward do missing", s.E.AttentionBackward(q, k, v, nil, q, k, v, o, lse, false, 1, [3]bool{}, ops.AttnDropout{})},
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
	if err := s.E.AttentionForward(o, lse, tr, k, v, false, 1, ops.AttnDropout{}); err == nil {
		s.T.Error("q with a strided last dimension was accepted")
	}
	// SelfAttention: qkv's last dimension must split into 3·heads parts.
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{})
	defer g.Free()
	x := g.Param("qkv", f(2, 5, 24), f(2, 5, 24))
	if y := g.SelfAttention(x, 5, true, 0); y != nil || g.Err() == nil {
		s.T.Error("SelfAttention with 24 columns and 5 heads was accepted")
	}
	for _, p := range []float32{-0.1, 1.5, float32(math.NaN())} {
		g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Train: true})
		x := g.Param("qkv", f(2, 5, 24), f(2, 5, 24))
		if y := g.SelfAttention(x, 2, true, p); y != nil || g.Err() == nil {
			s.T.Errorf("SelfAttention with dropout %v was accepted", p)
		}
		s.NoErr("free", g.Free())
	}
	ctr := UploadI32(s.T, s.A, []int32{0}, 1)
	for _, d := range []ops.AttnDropout{{P: -0.5}, {P: 2}, {P: 0.1, Site: -1}, {P: 0.1, B0: -1}, {P: 0.1, Counter: f(1)}, {P: 0.1, Counter: UploadI32(s.T, s.A, []int32{0, 1}, 2)}} {
		if err := s.E.AttentionForward(o, lse, q, k, v, false, 1, d); err == nil {
			s.T.Errorf("forward with dropout %+v accepted", d)
		}
		if err := s.E.AttentionBackward(q, k, v, o, q, k, v, o, lse, false, 1, [3]bool{}, d); err == nil {
			s.T.Errorf("backward with dropout %+v accepted", d)
		}
	}
	s.NoErr("dropout with a counter", s.E.AttentionForward(o, lse, q, k, v, false, 1, ops.AttnDropout{P: 0.1, Counter: ctr}))
}

// attnDropShards: a batch of 3 rows with dropout, whole, equals each row
// alone with B0 = its row (a data-parallel rank's shard), bitwise, forward
// and backward; and p = 0 with a seed, site and counter is bitwise no
// dropout.
func attnDropShards(s *Suite, dt tensor.DType, d int) {
	const B, T, H = 3, 13, 2
	a := AttnShape{B, T, T, H, d}
	scale := float32(1 / math.Sqrt(float64(d)))
	q, qv := s.Rand(dt, 1, B, T, H, d)
	k, kv := s.Rand(dt, 1, B, T, H, d)
	v, vv := s.Rand(dt, 1, B, T, H, d)
	do, _ := s.Rand(dt, 1, B, T, H, d)
	drop := attnDrop(s, 0.3)
	drop.B0 = 0
	run := func(q, k, v, do *tensor.Tensor, b int, drop ops.AttnDropout) (o, lse, dq, dk, dv []float64) {
		n := q.Dim(0)
		ot, lt := s.Empty(dt, n, T, H, d), s.Empty(tensor.F32, n, H, T)
		gq, gk, gv := s.Empty(dt, n, T, H, d), s.Empty(dt, n, T, H, d), s.Empty(dt, n, T, H, d)
		drop.B0 = int64(b)
		s.NoErr("forward", s.E.AttentionForward(ot, lt, q, k, v, true, scale, drop))
		s.NoErr("backward", s.E.AttentionBackward(gq, gk, gv, do, q, k, v, ot, lt, true, scale, [3]bool{}, drop))
		return s.Read(ot), s.Read(lt), s.Read(gq), s.Read(gk), s.Read(gv)
	}
	wo, wl, wq, wk, wv := run(q, k, v, do, 0, drop)
	// The whole batch against the float64 reference (B0 = 0).
	ro, _ := RefAttentionDrop(qv, kv, vv, a, true, float64(scale), RefAttnKeep(drop, attnDropStep, a), drop.P)
	s.Close("o (whole batch)", wo, ro, nil, s.Tol(dt))
	row := func(x *tensor.Tensor, b int) *tensor.Tensor {
		n, err := x.Narrow(0, b, 1)
		s.NoErr("narrow", err)
		return n
	}
	per := T * H * d
	for b := 0; b < B; b++ {
		o, l, gq, gk, gv := run(row(q, b), row(k, b), row(v, b), row(do, b), b, drop)
		for _, c := range []struct {
			what      string
			got, want []float64
		}{{"o", o, wo[b*per : (b+1)*per]}, {"lse", l, wl[b*H*T : (b+1)*H*T]}, {"dq", gq, wq[b*per : (b+1)*per]},
			{"dk", gk, wk[b*per : (b+1)*per]}, {"dv", gv, wv[b*per : (b+1)*per]}} {
			dropEqual(s, fmt.Sprintf("row %d %s", b, c.what), c.got, c.want)
		}
	}
	// p = 0 with everything else set is no dropout, bitwise.
	zero := attnDrop(s, 0.3)
	zero.P = 0
	o0, l0, q0, k0, v0 := run(q, k, v, do, 0, ops.AttnDropout{})
	o1, l1, q1, k1, v1 := run(q, k, v, do, 0, zero)
	for i, c := range [][2][]float64{{o0, o1}, {l0, l1}, {q0, q1}, {k0, k1}, {v0, v1}} {
		dropEqual(s, fmt.Sprintf("p=0 output %d", i), c[1], c[0])
	}
}

// attnDropCounter: the same counter value gives bitwise the same outputs;
// the next value, another site or another seed different ones.
func attnDropCounter(s *Suite, dt tensor.DType, d int) {
	const B, T, H = 2, 40, 2
	scale := float32(1 / math.Sqrt(float64(d)))
	q, _ := s.Rand(dt, 1, B, T, H, d)
	k, _ := s.Rand(dt, 1, B, T, H, d)
	v, _ := s.Rand(dt, 1, B, T, H, d)
	run := func(drop ops.AttnDropout) []float64 {
		o, l := s.Empty(dt, B, T, H, d), s.Empty(tensor.F32, B, H, T)
		s.NoErr("forward", s.E.AttentionForward(o, l, q, k, v, false, scale, drop))
		return s.Read(o)
	}
	base := attnDrop(s, 0.5)
	want := run(base)
	dropEqual(s, "same counter", run(base), want)
	other := func(what string, d ops.AttnDropout) {
		if TermsErr(run(d), want, nil) == 0 {
			s.T.Errorf("%s: the same outputs", what)
		}
	}
	next := base
	next.Counter = UploadI32(s.T, s.A, []int32{attnDropStep + 1}, 1)
	other("next counter", next)
	site := base
	site.Site++
	other("another site", site)
	seed := base
	seed.Seed++
	other("another seed", seed)
}

// selfAttentionDropGrad checks Graph.SelfAttention with dropout 0.3 in a
// training graph (site 0, the graph's seed and counter) against the float64
// reference with the same mask and finite differences: the mask is fixed,
// so the output is differentiable.
func selfAttentionDropGrad(s *Suite, dt tensor.DType, b, t, h, d int, causal bool) {
	const p, step = 0.3, 17
	a := AttnShape{b, t, t, h, d}
	c := h * d
	split := func(x []float64) (q, k, v []float64) {
		for r := 0; r < b*t; r++ {
			row := x[r*3*c : (r+1)*3*c]
			q, k, v = append(q, row[:c]...), append(k, row[c:2*c]...), append(v, row[2*c:]...)
		}
		return
	}
	ctr := UploadI32(s.T, s.A, []int32{step}, 1)
	opts := ops.GraphOptions{Train: true, Seed: attnDropSeed, Counter: ctr}
	keep := RefAttnKeep(ops.AttnDropout{P: p, Seed: attnDropSeed, Site: 0}, step, a)
	tolF := s.Tol(dt)
	s.GradCheck(GradCase{
		Name: fmt.Sprintf("self-attention dropout %v causal=%v", a, causal), DType: dt, Options: opts,
		Params: [][]int{{b, t, 3 * c}}, TolF: tolF, TolB: 10 * tolF,
		Record: func(g *ops.Graph, pv, _ []*ops.Var) *ops.Var { return g.SelfAttention(pv[0], h, causal, p) },
		Ref: func(pv [][]float64) []float64 {
			q, k, v := split(pv[0])
			o, _ := RefAttentionDrop(q, k, v, a, causal, 1/math.Sqrt(float64(d)), keep, p)
			return o
		},
	})
}

// selfAttentionSites: in a training graph SelfAttention with dropout takes
// the next call-site (a Dropout after it draws site 1's mask); with
// dropout 0, or outside training, it takes none; and a shard's graph
// numbers its batch rows from Shard × B.
func selfAttentionSites(s *Suite, dt tensor.DType) {
	const b, t, h, d, step = 2, 5, 1, 8, 3
	const n = b * t * h * d
	x, xv := s.Rand(dt, 1, b, t, 3*h*d)
	ctr := UploadI32(s.T, s.A, []int32{step}, 1)
	for _, c := range []struct {
		train bool
		p     float32
		site  uint32
	}{{true, 0.4, 1}, {true, 0, 0}, {false, 0.4, 0}} {
		g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Train: true, Seed: attnDropSeed, Counter: ctr, Autocast: dt})
		ga := g
		if !c.train {
			ga = ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Seed: attnDropSeed, Counter: ctr, Autocast: dt})
		}
		xa := ga.Input("qkv", x)
		y := ga.SelfAttention(xa, h, true, c.p)
		ones := s.Const(dt, dropOnesF(n), b, t, h*d)
		z := g.Dropout(g.Input("ones", ones), 0.5)
		s.NoErr("build", ga.Build(false))
		if ga != g {
			s.NoErr("build", g.Build(false))
			s.NoErr("forward", ga.Forward())
		}
		s.NoErr("forward", g.Forward())
		want := dropRound(dt, RefDropout(dropOnesF(n), RefDropoutMask(n, 0.5, attnDropSeed, c.site, step), 0.5))
		dropEqual(s, fmt.Sprintf("train=%v p=%v: the dropout after attention", c.train, c.p), s.Read(z.Value), want)
		if !c.train || c.p == 0 {
			o, _ := RefAttention(attnSplit(xv, b, t, h, d))
			s.Close("o (no dropout)", s.Read(y.Value), o, nil, s.Tol(dt))
		}
		s.NoErr("free", g.Free())
		if ga != g {
			s.NoErr("free", ga.Free())
		}
	}
	// Shard 1 of a graph over rows [b, 2b): the mask of rows b.. of the whole.
	g := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Train: true, Seed: attnDropSeed, Counter: ctr, Shard: 1, Autocast: dt})
	defer g.Free()
	y := g.SelfAttention(g.Input("qkv", x), h, true, 0.4)
	s.NoErr("build", g.Build(false))
	s.NoErr("forward", g.Forward())
	q, k, v, a, _, _ := attnSplit(xv, b, t, h, d)
	drop := ops.AttnDropout{P: 0.4, Seed: attnDropSeed, Site: 0, B0: b}
	o, _ := RefAttentionDrop(q, k, v, a, true, 1/math.Sqrt(d), RefAttnKeep(drop, step, a), 0.4)
	s.Close("o (shard 1)", s.Read(y.Value), o, nil, s.Tol(dt))
}

// attnSplit splits a row-major qkv [b,t,3·h·d] into RefAttention's
// arguments (causal, scale 1/√d).
func attnSplit(x []float64, b, t, h, d int) (q, k, v []float64, a AttnShape, causal bool, scale float64) {
	c := h * d
	for r := 0; r < b*t; r++ {
		row := x[r*3*c : (r+1)*3*c]
		q, k, v = append(q, row[:c]...), append(k, row[c:2*c]...), append(v, row[2*c:]...)
	}
	return q, k, v, AttnShape{b, t, t, h, d}, true, 1 / math.Sqrt(float64(d))
}

func dropOnesF(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	return v
}
