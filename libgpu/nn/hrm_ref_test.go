package nn

// A float64 reference of the HRM written from bench/reference/hrm.py's
// contract (its Inner and HRM modules), on plain slices, for the host
// tests of the forward, the one-step gradient and the ACT targets.

import (
	"math"
	"strconv"
)

// refHRM is an HRM's weights in float64, by name.
type refHRM struct {
	c HRMConfig
	w map[string][]float64
}

// refLinear is x [n, in] · Wᵀ [in, out] (+ b).
func refLinear(x []float64, n, in int, w []float64, out int, b []float64) []float64 {
	y := make([]float64, n*out)
	for i := 0; i < n; i++ {
		for o := 0; o < out; o++ {
			var s float64
			for k := 0; k < in; k++ {
				s += x[i*in+k] * w[o*in+k]
			}
			if b != nil {
				s += b[o]
			}
			y[i*out+o] = s
		}
	}
	return y
}

func refRMS(x []float64, C int, eps float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < len(x)/C; r++ {
		var q float64
		for _, v := range x[r*C : (r+1)*C] {
			q += v * v
		}
		inv := 1 / math.Sqrt(q/float64(C)+eps)
		for j := 0; j < C; j++ {
			y[r*C+j] = x[r*C+j] * inv
		}
	}
	return y
}

func refAdd(a, b []float64) []float64 {
	y := make([]float64, len(a))
	for i := range a {
		y[i] = a[i] + b[i]
	}
	return y
}

// refRoPETables are hrm.py's cos and sin (rotate_half layout) in float64.
func refRoPETables(T, D int, theta float64) (cos, sin []float64) {
	cos, sin = make([]float64, T*D), make([]float64, T*D)
	for t := 0; t < T; t++ {
		for i := 0; i < D/2; i++ {
			f := float64(t) / math.Pow(theta, float64(2*i)/float64(D))
			cos[t*D+i], cos[t*D+i+D/2] = math.Cos(f), math.Cos(f)
			sin[t*D+i], sin[t*D+i+D/2] = math.Sin(f), math.Sin(f)
		}
	}
	return cos, sin
}

// attention is one block's self-attention on h [B, T, C].
func (r *refHRM) attention(h []float64, B, T int, p string) []float64 {
	c := r.c
	C, H, D := c.Hidden, c.Heads, c.HeadDim()
	qkv := refLinear(h, B*T, C, r.w[p+"self_attn.qkv_proj.weight"], 3*C, nil)
	cos, sin := refRoPETables(T, D, c.RopeTheta)
	rot := func(b, t, head int) []float64 { // q or k head vector after RoPE
		v := qkv[(b*T+t)*3*C+head*D : (b*T+t)*3*C+head*D+D]
		out := make([]float64, D)
		for i := 0; i < D; i++ {
			var rh float64 // rotate_half(v)[i]
			if i < D/2 {
				rh = -v[i+D/2]
			} else {
				rh = v[i-D/2]
			}
			out[i] = v[i]*cos[t*D+i] + rh*sin[t*D+i]
		}
		return out
	}
	o := make([]float64, B*T*C)
	scale := 1 / math.Sqrt(float64(D))
	for b := 0; b < B; b++ {
		for hd := 0; hd < H; hd++ {
			ks := make([][]float64, T)
			for j := 0; j < T; j++ {
				ks[j] = rot(b, j, H+hd)
			}
			for i := 0; i < T; i++ {
				q := rot(b, i, hd)
				s := make([]float64, T)
				mx := math.Inf(-1)
				for j := 0; j < T; j++ {
					for d := 0; d < D; d++ {
						s[j] += q[d] * ks[j][d]
					}
					s[j] *= scale
					mx = math.Max(mx, s[j])
				}
				var z float64
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					z += s[j]
				}
				for j := 0; j < T; j++ {
					v := qkv[(b*T+j)*3*C+2*C+hd*D:]
					for d := 0; d < D; d++ {
						o[(b*T+i)*C+hd*D+d] += s[j] / z * v[d]
					}
				}
			}
		}
	}
	return refLinear(o, B*T, C, r.w[p+"self_attn.o_proj.weight"], C, nil)
}

func (r *refHRM) mlp(h []float64, n int, p string) []float64 {
	c := r.c
	C, I := c.Hidden, c.Inter()
	gu := refLinear(h, n, C, r.w[p+"mlp.gate_up_proj.weight"], 2*I, nil)
	a := make([]float64, n*I)
	for i := 0; i < n; i++ {
		for j := 0; j < I; j++ {
			g, u := gu[i*2*I+j], gu[i*2*I+I+j]
			a[i*I+j] = g / (1 + math.Exp(-g)) * u
		}
	}
	return refLinear(a, n, I, r.w[p+"mlp.down_proj.weight"], C, nil)
}

// level is hrm.py's Level.forward: blocks(z + inj).
func (r *refHRM) level(name string, z, inj []float64, B, T int) []float64 {
	c := r.c
	n := c.HLayers
	if name == "L" {
		n = c.LLayers
	}
	h := refAdd(z, inj)
	for i := 0; i < n; i++ {
		p := "inner." + name + "_level.layers." + strconv.Itoa(i) + "."
		h = refRMS(refAdd(h, r.attention(h, B, T, p)), c.Hidden, c.RMSEps)
		h = refRMS(refAdd(h, r.mlp(h, B*T, p)), c.Hidden, c.RMSEps)
	}
	return h
}

// embed is √C·cat(puzzle_emb, embed_tokens[tokens]) for tokens [B, T]
// (position 0 = the puzzle token row).
func (r *refHRM) embed(tokens []int32, B, T int) []float64 {
	c := r.c
	C := c.Hidden
	x := make([]float64, B*T*C)
	s := math.Sqrt(float64(C))
	for i, tk := range tokens {
		var row []float64
		if int(tk) == c.Vocab {
			row = r.w["inner.puzzle_emb.weights"][:C]
		} else {
			row = r.w["inner.embed_tokens.embedding_weight"][int(tk)*C : int(tk+1)*C]
		}
		for j := 0; j < C; j++ {
			x[i*C+j] = s * row[j]
		}
	}
	return x
}

// cycles runs hrm.py's inner loop from (zH, zL) with input x: without
// full, all but the last L and H updates.
func (r *refHRM) cycles(zH, zL, x []float64, B, T int, full bool) (h, l []float64) {
	c := r.c
	for i := 0; i < c.HCycles; i++ {
		for j := 0; j < c.LCycles; j++ {
			if !full && i == c.HCycles-1 && j == c.LCycles-1 {
				continue
			}
			zL = r.level("L", zL, refAdd(zH, x), B, T)
		}
		if full || i != c.HCycles-1 {
			zH = r.level("H", zH, zL, B, T)
		}
	}
	return zH, zL
}

// last is the segment's last L and H updates (the ones with gradients).
func (r *refHRM) last(zH, zL, x []float64, B, T int) (h, l []float64) {
	zL = r.level("L", zL, refAdd(zH, x), B, T)
	return r.level("H", zH, zL, B, T), zL
}

// heads are the logits [B, T, V] and the Q logits [B, 2] of zH.
func (r *refHRM) heads(zH []float64, B, T int) (logits, q []float64) {
	c := r.c
	C := c.Hidden
	logits = refLinear(zH, B*T, C, r.w["inner.lm_head.weight"], c.Vocab, nil)
	first := make([]float64, B*C)
	for b := 0; b < B; b++ {
		copy(first[b*C:(b+1)*C], zH[b*T*C:])
	}
	return logits, refLinear(first, B, C, r.w["inner.q_head.weight"], 2, r.w["inner.q_head.bias"])
}

// init is the carry of halted slots: H_init, L_init broadcast.
func (r *refHRM) init(B, T int) (zH, zL []float64) {
	C := r.c.Hidden
	zH, zL = make([]float64, B*T*C), make([]float64, B*T*C)
	for i := range zH {
		zH[i] = r.w["inner.H_init"][i%C]
		zL[i] = r.w["inner.L_init"][i%C]
	}
	return zH, zL
}

// refLoss is the segment's loss from its logits and Q logits with fixed
// Q targets qt [B, 2], divided by B as the training step's backward is:
// (Σ_b mean over labelled cells of the stablemax cross-entropy
// + ½ Σ_b (BCE(q_halt, qt0) + BCE(q_continue, qt1))) / B.
func refLoss(logits, q, qt []float64, targets []int32, B, T, V int) (lm, ql float64) {
	for b := 0; b < B; b++ {
		var s float64
		n := 0
		for t := 0; t < T; t++ {
			y := targets[b*T+t]
			if y < 0 {
				continue
			}
			row := logits[(b*T+t)*V : (b*T+t+1)*V]
			var S float64
			for _, x := range row {
				S += stablemaxS(x)
			}
			s += math.Log(S) - math.Log(stablemaxS(row[y]))
			n++
		}
		lm += s / float64(n)
		for k := 0; k < 2; k++ {
			x, y := q[2*b+k], qt[2*b+k]
			ql += 0.5 * (math.Max(x, 0) - x*y + math.Log1p(math.Exp(-math.Abs(x))))
		}
	}
	return lm / float64(B), ql / float64(B)
}

func stablemaxS(x float64) float64 {
	if x < 0 {
		return 1 / (1 - x)
	}
	return x + 1
}
