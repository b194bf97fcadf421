package ops

// The groupnorm family: group normalisation of channels-last feature maps,
// optionally fused with the SiLU that follows it in a diffusion U-Net's
// residual blocks, forward and backward (libgpu/kernels/groupnorm.cu), and
// Graph.GroupNorm. Reference and checks: opstest/groupnorm.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// gnShape is a validated GroupNorm call: N samples of S positions of C
// channels in G groups.
type gnShape struct {
	n, s, c, g int
}

func (e *Engine) gnCheck(op string, x *tensor.Tensor, groups int, w, b, mean, rstd *tensor.Tensor) (gnShape, error) {
	var s gnShape
	if err := e.checkView(op+" x", x, true, floatTypes); err != nil {
		return s, err
	}
	if x.Rank() < 2 {
		return s, fmt.Errorf("%w: %s x %v, want [N, ..., C]", tensor.ErrShape, op, x.Shape)
	}
	s.n, s.c = x.Dim(0), x.Dim(-1)
	if s.n > 0 && s.c > 0 {
		s.s = x.Numel() / (s.n * s.c)
	}
	if groups < 1 || s.c%groups != 0 {
		return s, fmt.Errorf("%w: %s of %d channels in %d groups (want a divisor)", ErrConfig, op, s.c, groups)
	}
	if s.c > gnMaxC {
		return s, fmt.Errorf("%w: %s of %d channels (at most %d)", tensor.ErrShape, op, s.c, gnMaxC)
	}
	s.g = groups
	for _, p := range []struct {
		what string
		t    *tensor.Tensor
	}{{op + " w", w}, {op + " b", b}} {
		if p.t != nil {
			if err := e.checkView(p.what, p.t, true, []tensor.DType{tensor.F32}, s.c); err != nil {
				return s, err
			}
		}
	}
	for _, p := range []struct {
		what string
		t    *tensor.Tensor
	}{{op + " mean", mean}, {op + " rstd", rstd}} {
		if p.t != nil {
			if err := e.checkView(p.what, p.t, true, []tensor.DType{tensor.F32}); err != nil {
				return s, err
			}
			if p.t.Numel() != s.n*s.g {
				return s, fmt.Errorf("%w: %s %v, want N·G = %d elements", tensor.ErrShape, p.what, p.t.Shape, s.n*s.g)
			}
		}
	}
	return s, nil
}

// gnMaxC is the most channels the kernels take (a block's threads cover a
// row of channels, 8 per thread).
const gnMaxC = 8192

// GroupNorm normalises x [N, ..., C] (channels last, contiguous, f32 or
// bf16) over each sample's G groups of C/G consecutive channels and all
// its positions (Wu & He 2018, "Group Normalization"; PyTorch's
// nn.GroupNorm(G, C, eps) on the channels-first equivalent, biased
// variance), then scales and shifts per channel, and with silu applies
// SiLU (Elfwing et al. 2018; x·σ(x)) to the result:
//
//	μ, σ² over the S·C/G values of (n, g);  rstd = 1/√(σ² + eps)
//	z = (x − μ)·rstd·w[c] + b[c];  y = z, or z·σ(z) with silu
//
// y of x's shape and dtype (y may be x); w, b f32 [C] or nil (ones,
// zeros); mean and rstd f32 with N·G elements ([N, G] row-major), saved
// for the backward, or nil. groups must divide C; C ≤ 8192. Computed in
// f32 with two passes over each group (no cancellation in the variance).
// Errors wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout,
// exec.ErrDevice or ErrConfig.
func (e *Engine) GroupNorm(y, mean, rstd, x, w, b *tensor.Tensor, groups int, eps float32, silu bool) error {
	if !(eps >= 0) || math.IsInf(float64(eps), 1) {
		return fmt.Errorf("%w: groupnorm eps %v", ErrConfig, eps)
	}
	s, err := e.gnCheck("groupnorm", x, groups, w, b, mean, rstd)
	if err != nil {
		return err
	}
	if err := e.checkView("groupnorm y", y, true, []tensor.DType{x.DType}, x.Shape...); err != nil {
		return err
	}
	if s.n == 0 || s.c == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostGroupNorm(&s, y, mean, rstd, x, w, b, eps, silu) },
		func(c *cudaImpl) error { return c.groupNorm(&s, y, mean, rstd, x, w, b, eps, silu) })
}

// GroupNormBackward computes the gradients of GroupNorm from dy, x, w, b
// and the saved mean and rstd. With x̂ = (x − μ)·rstd, z = x̂·w + b and
// dz = dy·SiLU'(z) (dz = dy without silu; SiLU'(z) = σ(z)(1 + z(1 − σ(z)))),
// per (n, g) with M = S·C/G values and sums over them:
//
//	dx = rstd·(dz·w − Σ(dz·w)/M − x̂·Σ(dz·w·x̂)/M)
//	dw[c] = Σ_{n,s} dz·x̂,  db[c] = Σ_{n,s} dz
//
// dx and dy of x's shape and dtype; dw, db f32 [C]; any of dx, dw, db
// may be nil; acc[0..2] add to them instead of overwriting. b is read only
// with silu. On CUDA one kernel computes dx and per-sample partial sums
// of dw and db, and a second sums the partials over samples in a fixed
// order: no atomics, the same bits on every run. Errors as GroupNorm.
func (e *Engine) GroupNormBackward(dx, dw, db, dy, x, w, b, mean, rstd *tensor.Tensor, groups int, silu bool, acc [3]bool) error {
	s, err := e.gnCheck("groupnorm backward", x, groups, w, b, mean, rstd)
	if err != nil {
		return err
	}
	if mean == nil || rstd == nil {
		return fmt.Errorf("%w: groupnorm backward needs the saved mean and rstd", tensor.ErrShape)
	}
	if err := e.checkView("groupnorm backward dy", dy, true, []tensor.DType{x.DType}, x.Shape...); err != nil {
		return err
	}
	if dx != nil {
		if err := e.checkView("groupnorm backward dx", dx, true, []tensor.DType{x.DType}, x.Shape...); err != nil {
			return err
		}
	}
	for _, p := range []struct {
		what string
		t    *tensor.Tensor
	}{{"groupnorm backward dw", dw}, {"groupnorm backward db", db}} {
		if p.t != nil {
			if err := e.checkView(p.what, p.t, true, []tensor.DType{tensor.F32}, s.c); err != nil {
				return err
			}
		}
	}
	if s.c == 0 || (dx == nil && dw == nil && db == nil) {
		return nil
	}
	if s.n == 0 {
		for i, t := range []*tensor.Tensor{dw, db} {
			if t != nil && !acc[i+1] {
				if err := e.Fill(t, 0); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		return hostGroupNormBackward(&s, dx, dw, db, dy, x, w, b, mean, rstd, silu, acc)
	},
		func(c *cudaImpl) error {
			return c.groupNormBackward(&s, dx, dw, db, dy, x, w, b, mean, rstd, silu, acc)
		})
}

// sigmoid64 is 1/(1 + e^(−z)).
func sigmoid64(z float64) float64 { return 1 / (1 + math.Exp(-z)) }

// ---- host ----

func hostGroupNorm(s *gnShape, y, mean, rstd, x, w, b *tensor.Tensor, eps float32, silu bool) error {
	ins, err := hostIns(x, w, b)
	if err != nil {
		return err
	}
	xs, ws, bs := ins[0], ins[1], ins[2]
	ys, commit, err := hostOut(y, false)
	if err != nil {
		return err
	}
	ms, mCommit, err := hostOut(mean, false)
	if err != nil {
		return err
	}
	rs, rCommit, err := hostOut(rstd, false)
	if err != nil {
		return err
	}
	cg := s.c / s.g
	cnt := float64(s.s * cg)
	for n := 0; n < s.n; n++ {
		xn := xs[n*s.s*s.c : (n+1)*s.s*s.c]
		yn := ys[n*s.s*s.c : (n+1)*s.s*s.c]
		for g := 0; g < s.g; g++ {
			var sum float64
			for p := 0; p < s.s; p++ {
				for _, v := range xn[p*s.c+g*cg : p*s.c+(g+1)*cg] {
					sum += float64(v)
				}
			}
			mu := sum / cnt
			var q float64
			for p := 0; p < s.s; p++ {
				for _, v := range xn[p*s.c+g*cg : p*s.c+(g+1)*cg] {
					d := float64(v) - mu
					q += d * d
				}
			}
			r := 1 / math.Sqrt(q/cnt+float64(eps))
			for p := 0; p < s.s; p++ {
				for c := g * cg; c < (g+1)*cg; c++ {
					z := (float64(xn[p*s.c+c]) - mu) * r
					if ws != nil {
						z *= float64(ws[c])
					}
					if bs != nil {
						z += float64(bs[c])
					}
					if silu {
						z *= sigmoid64(z)
					}
					yn[p*s.c+c] = float32(z) // y may be x: each element is read before it is written
				}
			}
			if ms != nil {
				ms[n*s.g+g] = float32(mu)
			}
			if rs != nil {
				rs[n*s.g+g] = float32(r)
			}
		}
	}
	if err := mCommit(); err != nil {
		return err
	}
	if err := rCommit(); err != nil {
		return err
	}
	return commit()
}

func hostGroupNormBackward(s *gnShape, dx, dw, db, dy, x, w, b, mean, rstd *tensor.Tensor, silu bool, acc [3]bool) error {
	ins, err := hostIns(x, dy, w, b, mean, rstd)
	if err != nil {
		return err
	}
	xs, gs, ws, bs, ms, rs := ins[0], ins[1], ins[2], ins[3], ins[4], ins[5]
	dxs, dxCommit, err := hostOut(dx, acc[0])
	if err != nil {
		return err
	}
	wAt := func(c int) float64 {
		if ws == nil {
			return 1
		}
		return float64(ws[c])
	}
	bAt := func(c int) float64 {
		if bs == nil {
			return 0
		}
		return float64(bs[c])
	}
	cg := s.c / s.g
	cnt := float64(s.s * cg)
	sw := make([]float64, s.c)
	sb := make([]float64, s.c)
	dz := make([]float64, s.s*cg)
	xh := make([]float64, s.s*cg)
	for n := 0; n < s.n; n++ {
		for g := 0; g < s.g; g++ {
			mu, r := float64(ms[n*s.g+g]), float64(rs[n*s.g+g])
			var a1, a2 float64
			for p := 0; p < s.s; p++ {
				for k := 0; k < cg; k++ {
					c := g*cg + k
					i := (n*s.s+p)*s.c + c
					h := (float64(xs[i]) - mu) * r
					d := float64(gs[i])
					if silu {
						z := h*wAt(c) + bAt(c)
						sg := sigmoid64(z)
						d *= sg * (1 + z*(1-sg))
					}
					dz[p*cg+k], xh[p*cg+k] = d, h
					a1 += d * wAt(c)
					a2 += d * wAt(c) * h
					sw[c] += d * h
					sb[c] += d
				}
			}
			if dxs == nil {
				continue
			}
			m1, m2 := a1/cnt, a2/cnt
			for p := 0; p < s.s; p++ {
				for k := 0; k < cg; k++ {
					c := g*cg + k
					dxs[(n*s.s+p)*s.c+c] = float32(r * (dz[p*cg+k]*wAt(c) - m1 - xh[p*cg+k]*m2))
				}
			}
		}
	}
	if err := hostOut64(dw, acc[1], sw); err != nil {
		return err
	}
	if err := hostOut64(db, acc[2], sb); err != nil {
		return err
	}
	return dxCommit()
}

// ---- CUDA ----

// gnPlan is the launch geometry of groupnorm.cu: one block per sample (and
// blockIdx.y per split of its positions in the backward's partials), bx
// threads across the row of C channels (V per thread), by rows of
// positions; dynamic shared memory (by + 2)·C floats.
type gnPlan struct {
	inst   string
	bx, by int
	smem   uint32
}

func gnPlanFor(s *gnShape, vec bool) gnPlan {
	v, inst := 1, "s"
	if vec && s.c%rwVecWidth == 0 {
		v, inst = rwVecWidth, "v"
	}
	bx := s.c / v
	// Rows of threads: about 256 threads, a whole number of warps where
	// that stays within 1024 threads.
	by0 := 32 / gcd(bx, 32)
	by := max(1, 256/bx)
	if bx*by0 <= 1024 {
		by = by0 * max(1, 256/(bx*by0))
	}
	return gnPlan{inst: inst, bx: bx, by: by, smem: uint32((by + 2) * s.c * 4)}
}

// check fails when a row of channels needs more than a block's
// threads (the scalar instance, C > 1024 not a multiple of 8).
func (p gnPlan) check() error {
	if p.bx > 1024 {
		return fmt.Errorf("%w: groupnorm of %d channels needs C a multiple of 8 and 16-byte aligned tensors", tensor.ErrLayout, p.bx)
	}
	return nil
}

// gnSplitRows is the fewest rows of positions a block of the split
// forward (gn_stats, gn_norm) takes.
const gnSplitRows = 64

// gnChunks is the split forward's rows per block (chunk) and blocks per
// sample (k) for N samples of S positions on sms multiprocessors, by rows
// of threads a block: k = 1 (one block per sample, gn_fwd) when N blocks
// fill two waves or a sample has too few rows to split, else enough blocks
// for two waves, each at least max(gnSplitRows, by) rows.
func gnChunks(n, s, sms, by int) (chunk, k int) {
	k = 1
	if want := (2*sms + n - 1) / n; want > 1 {
		k = min(want, max(1, s/max(gnSplitRows, by)))
	}
	chunk = (s + k - 1) / k
	return chunk, (s + chunk - 1) / chunk
}

func (c *cudaImpl) groupNorm(s *gnShape, y, mean, rstd, x, w, b *tensor.Tensor, eps float32, silu bool) error {
	p := gnPlanFor(s, rwVecOK([]*tensor.Tensor{x, y, w, b}))
	if err := p.check(); err != nil {
		return err
	}
	inst := p.inst + "_" + dtName(x.DType)
	block := [3]uint32{uint32(p.bx), uint32(p.by), 1}
	if chunk, k := gnChunks(s.n, s.s, c.SMCount(), p.by); k > 1 {
		// Split over positions: per-block moments, then every block merges
		// its sample's and normalises its rows.
		part, err := c.Scratch("groupnorm.moments", 2*int64(s.n)*int64(k)*int64(s.g)*4)
		if err != nil {
			return err
		}
		grid := [3]uint32{uint32(s.n), uint32(k), 1}
		if err := launch.GnStats(c, inst, grid, block, p.smem, part, devPtr(x), int32(s.s), int32(s.c), int32(s.g), int32(chunk)); err != nil {
			return err
		}
		return launch.GnNorm(c, inst, grid, block, uint32(2*s.g*4), devPtr(y), devPtr(mean), devPtr(rstd), part, devPtr(x),
			devPtr(w), devPtr(b), int32(s.s), int32(s.c), int32(s.g), eps, launch.Bool(silu), int32(chunk))
	}
	return launch.GnFwd(c, inst, grid1(s.n), block, p.smem,
		devPtr(y), devPtr(mean), devPtr(rstd), devPtr(x), devPtr(w), devPtr(b), int32(s.s), int32(s.c), int32(s.g), eps, launch.Bool(silu))
}

func (c *cudaImpl) groupNormBackward(s *gnShape, dx, dw, db, dy, x, w, b, mean, rstd *tensor.Tensor, silu bool, acc [3]bool) error {
	p := gnPlanFor(s, rwVecOK([]*tensor.Tensor{x, dy, dx, w, b}))
	if err := p.check(); err != nil {
		return err
	}
	p.smem = uint32((2*p.by + 2) * s.c * 4) // two rows of partials per thread row
	part, err := c.Scratch("groupnorm.partials", 2*int64(s.n)*int64(s.c)*4)
	if err != nil {
		return err
	}
	if err := launch.GnBwd(c, p.inst+"_"+dtName(x.DType), grid1(s.n), [3]uint32{uint32(p.bx), uint32(p.by), 1}, p.smem,
		devPtr(dx), part, devPtr(dy), devPtr(x), devPtr(w), devPtr(b), devPtr(mean), devPtr(rstd),
		int32(s.s), int32(s.c), int32(s.g), launch.Bool(silu), launch.Bool(acc[0])); err != nil {
		return err
	}
	if dw == nil && db == nil {
		return nil
	}
	return launch.GnBwdReduce(c, grid1((s.c+255)/256), block1(256), 0,
		devPtr(dw), devPtr(db), part, int32(s.n), int32(s.c), launch.Bool(acc[1]), launch.Bool(acc[2]))

}

// ---- graph ----

// GroupNorm records y = GroupNorm(x)·w + b (Engine.GroupNorm; PyTorch's
// nn.GroupNorm(groups, C, eps) on the channels-first equivalent), followed
// by SiLU when silu (the norm → activation pair of a U-Net's residual
// block, one pass each way): x [N, ..., C] contiguous of any float dtype,
// y of x's shape and dtype, w and b f32 [C] parameters or nil. The
// per-(sample, group) mean and rstd are saved for the backward.
func (g *Graph) GroupNorm(x, w, b *Var, groups int, eps float32, silu bool) *Var {
	if !g.ok(x) {
		return nil
	}
	g.prefetch("groupnorm.cu")
	if err := rwFloat("groupnorm x", x); err != nil {
		g.Fail("groupnorm", err)
		return nil
	}
	xs := x.Value.Shape
	if len(xs) < 2 || groups < 1 || xs[len(xs)-1]%groups != 0 {
		g.Fail("groupnorm", fmt.Errorf("%w: groupnorm of %v in %d groups", tensor.ErrShape, xs, groups))
		return nil
	}
	cols := xs[len(xs)-1]
	if !g.lnParams("groupnorm", cols, w, b) {
		return nil
	}
	in, wi, bi := withAffine([]*Var{x}, w, b)
	op := "groupnorm"
	if silu {
		op = "groupnorm_silu"
	}
	y := g.NewOut(op, x.Value.DType, xs...)
	mean := g.NewOut(op+".mean", tensor.F32, xs[0], groups)
	rstd := g.NewOut(op+".rstd", tensor.F32, xs[0], groups)
	if !g.ok(y, mean, rstd) {
		return nil
	}
	val := func(i int) *tensor.Tensor {
		if i < 0 {
			return nil
		}
		return in[i].Value
	}
	e := g.e
	g.Record(op, in, []*Var{y, mean, rstd}, func(*Grads) error {
		return e.GroupNorm(y.Value, mean.Value, rstd.Value, x.Value, val(wi), val(bi), groups, eps, silu)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil {
			return nil
		}
		var dw, db *tensor.Tensor
		var acc [3]bool
		acc[0] = gr.Acc(0)
		if wi >= 0 {
			dw, acc[1] = gr.In(wi), gr.Acc(wi)
		}
		if bi >= 0 {
			db, acc[2] = gr.In(bi), gr.Acc(bi)
		}
		return e.GroupNormBackward(gr.In(0), dw, db, dy, x.Value, val(wi), val(bi), mean.Value, rstd.Value, groups, silu, acc)
	})
	return y
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
