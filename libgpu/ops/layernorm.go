package ops

// The layernorm family: layer normalisation over the last dimension with
// its fused backward (libgpu/kernels/layernorm.cu), and Graph.LayerNorm.
// Reference and checks: opstest/layernorm.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/tensor"
)

// lnArgs is a validated LayerNorm or LayerNormBackward call: the row
// tensors viewed as [rows, C] and their row strides.
type lnArgs struct {
	rows, cols int
	x, y       *tensor.Tensor // forward: y; backward: dy
	dx         *tensor.Tensor
	ldx, ldy   int
	lddx       int
}

// checkLNParam checks an optional f32 [C] parameter (or its gradient).
func (e *Engine) checkLNParam(what string, t *tensor.Tensor, cols int) error {
	if t == nil {
		return nil
	}
	return e.checkView(what, t, true, []tensor.DType{tensor.F32}, cols)
}

// checkLNStats checks a saved per-row statistic: f32, contiguous, one
// element per row (any shape).
func (e *Engine) checkLNStats(what string, t *tensor.Tensor, rows int) error {
	if err := e.checkView(what, t, true, []tensor.DType{tensor.F32}); err != nil {
		return err
	}
	if t.Numel() != rows {
		return fmt.Errorf("%w: %s %v has %d elements, want one per row (%d)", tensor.ErrShape, what, t.Shape, t.Numel(), rows)
	}
	return nil
}

// LayerNorm normalises every row of x over its last dimension C (Ba, Kiros
// & Hinton 2016, "Layer Normalization"; PyTorch's F.layer_norm over the last
// dimension, with the biased variance):
//
//	μ = Σx/C,  σ² = Σ(x−μ)²/C,  rstd = 1/√(σ² + eps),  y = (x−μ)·rstd·w + b
//
// x and y: [..., C], one shape and one dtype (f32 or bf16); their rows may
// be strided (the leading dimensions must merge into one row stride, the
// last dimension contiguous: a column slice of a wider tensor works). w and
// b: f32 [C], or nil for ones and zeros. mean and rstd: f32, contiguous,
// one element per row of x (any shape, e.g. [rows] or x's leading
// dimensions), saved for LayerNormBackward; both may be nil when no
// backward follows. Computed in f32 (the CUDA kernel reads x once and
// writes y once). Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout, ErrDevice or ErrConfig (eps negative or NaN).
func (e *Engine) LayerNorm(y, mean, rstd, x, w, b *tensor.Tensor, eps float32) error {
	if !(eps >= 0) || math.IsInf(float64(eps), 1) {
		return fmt.Errorf("%w: layernorm eps %v", ErrConfig, eps)
	}
	if err := e.checkView("layernorm x", x, false, floatTypes); err != nil {
		return err
	}
	if err := e.checkView("layernorm y", y, false, []tensor.DType{x.DType}, x.Shape...); err != nil {
		return err
	}
	var a lnArgs
	var err error
	if a.x, a.rows, a.cols, a.ldx, err = rwRows("layernorm x", x); err != nil {
		return err
	}
	if a.y, _, _, a.ldy, err = rwRows("layernorm y", y); err != nil {
		return err
	}
	if err := e.checkLNParam("layernorm w", w, a.cols); err != nil {
		return err
	}
	if err := e.checkLNParam("layernorm b", b, a.cols); err != nil {
		return err
	}
	for _, s := range []struct {
		what string
		t    *tensor.Tensor
	}{{"layernorm mean", mean}, {"layernorm rstd", rstd}} {
		if s.t == nil {
			continue
		}
		if err := e.checkLNStats(s.what, s.t, a.rows); err != nil {
			return err
		}
	}
	if a.rows == 0 || a.cols == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostLayerNorm(&a, mean, rstd, w, b, eps) },
		func(c *cudaImpl) error { return c.layerNorm(&a, mean, rstd, w, b, eps) })
}

// LayerNormBackward computes the gradients of LayerNorm from dy (the
// gradient of y), x, w and the saved mean and rstd, with x̂ = (x−μ)·rstd
// and g = dy·w:
//
//	dx = rstd·(g − Σg/C − x̂·Σ(g·x̂)/C)     (per row, sums over the row)
//	dw = Σ_rows dy·x̂,  db = Σ_rows dy
//
// Shapes and dtypes as LayerNorm: dx and dy of x's shape and dtype (rows
// may be strided); w f32 [C] or nil (ones); mean, rstd as LayerNorm wrote
// them; dw and db f32 [C]. Any of dx, dw, db may be nil (not wanted).
// acc[0], acc[1], acc[2] add dx, dw, db to what those tensors hold instead
// of overwriting it. On CUDA one kernel computes dx and per-block partial
// sums of dw and db, and a second reduces the partials in a fixed order:
// no atomics, the same bits on every run. Errors as LayerNorm.
func (e *Engine) LayerNormBackward(dx, dw, db, dy, x, w, mean, rstd *tensor.Tensor, acc [3]bool) error {
	if err := e.checkView("layernorm backward x", x, false, floatTypes); err != nil {
		return err
	}
	if err := e.checkView("layernorm backward dy", dy, false, []tensor.DType{x.DType}, x.Shape...); err != nil {
		return err
	}
	var a lnArgs
	var err error
	if a.x, a.rows, a.cols, a.ldx, err = rwRows("layernorm backward x", x); err != nil {
		return err
	}
	if a.y, _, _, a.ldy, err = rwRows("layernorm backward dy", dy); err != nil {
		return err
	}
	if dx != nil {
		if err := e.checkView("layernorm backward dx", dx, false, []tensor.DType{x.DType}, x.Shape...); err != nil {
			return err
		}
		if a.dx, _, _, a.lddx, err = rwRows("layernorm backward dx", dx); err != nil {
			return err
		}
	}
	for _, p := range []struct {
		what string
		t    *tensor.Tensor
	}{{"layernorm backward w", w}, {"layernorm backward dw", dw}, {"layernorm backward db", db}} {
		if err := e.checkLNParam(p.what, p.t, a.cols); err != nil {
			return err
		}
	}
	if err := e.checkLNStats("layernorm backward mean", mean, a.rows); err != nil {
		return err
	}
	if err := e.checkLNStats("layernorm backward rstd", rstd, a.rows); err != nil {
		return err
	}
	if a.cols == 0 || (dx == nil && dw == nil && db == nil) {
		return nil
	}
	if a.rows == 0 {
		// No rows: dx is empty; the parameter gradients are sums of nothing.
		for i, t := range []*tensor.Tensor{dw, db} {
			if t != nil && !acc[i+1] {
				if err := e.Fill(t, 0); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostLayerNormBackward(&a, dw, db, w, mean, rstd, acc) },
		func(c *cudaImpl) error { return c.layerNormBackward(&a, dw, db, w, mean, rstd, acc) })
}

// ---- host ----

func hostLayerNorm(a *lnArgs, mean, rstd, w, b *tensor.Tensor, eps float32) error {
	xs, err := hostIn(a.x)
	if err != nil {
		return err
	}
	ws, err := hostIn(w)
	if err != nil {
		return err
	}
	bs, err := hostIn(b)
	if err != nil {
		return err
	}
	ys, commit, err := hostOut(a.y, false)
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
	C := a.cols
	for r := 0; r < a.rows; r++ {
		row := xs[r*C : (r+1)*C]
		var s float64
		for _, v := range row {
			s += float64(v)
		}
		mu := s / float64(C)
		var q float64
		for _, v := range row {
			d := float64(v) - mu
			q += d * d
		}
		inv := float32(1 / math.Sqrt(q/float64(C)+float64(eps)))
		m := float32(mu)
		out := ys[r*C : (r+1)*C]
		for j, v := range row {
			o := (v - m) * inv
			if ws != nil {
				o *= ws[j]
			}
			if bs != nil {
				o += bs[j]
			}
			out[j] = o
		}
		if ms != nil {
			ms[r] = m
		}
		if rs != nil {
			rs[r] = inv
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

func hostLayerNormBackward(a *lnArgs, dw, db, w, mean, rstd *tensor.Tensor, acc [3]bool) error {
	xs, err := hostIn(a.x)
	if err != nil {
		return err
	}
	gs, err := hostIn(a.y)
	if err != nil {
		return err
	}
	ws, err := hostIn(w)
	if err != nil {
		return err
	}
	ms, err := hostIn(mean)
	if err != nil {
		return err
	}
	rs, err := hostIn(rstd)
	if err != nil {
		return err
	}
	dxs, dxCommit, err := hostOut(a.dx, acc[0])
	if err != nil {
		return err
	}
	C := a.cols
	sw := make([]float64, C)
	sb := make([]float64, C)
	xh := make([]float64, C)
	gw := make([]float64, C)
	for r := 0; r < a.rows; r++ {
		mu, inv := float64(ms[r]), float64(rs[r])
		var s1, s2 float64
		for j := 0; j < C; j++ {
			d := float64(gs[r*C+j])
			xh[j] = (float64(xs[r*C+j]) - mu) * inv
			gw[j] = d
			if ws != nil {
				gw[j] *= float64(ws[j])
			}
			s1 += gw[j]
			s2 += gw[j] * xh[j]
			sw[j] += d * xh[j]
			sb[j] += d
		}
		if dxs == nil {
			continue
		}
		m1, m2 := s1/float64(C), s2/float64(C)
		for j := 0; j < C; j++ {
			dxs[r*C+j] = float32(inv * (gw[j] - m1 - xh[j]*m2))
		}
	}
	for i, p := range []struct {
		t *tensor.Tensor
		s []float64
	}{{dw, sw}, {db, sb}} {
		out, commit, err := hostOut(p.t, acc[i+1])
		if err != nil {
			return err
		}
		for j := range out {
			out[j] = float32(p.s[j])
		}
		if err := commit(); err != nil {
			return err
		}
	}
	return dxCommit()
}

// ---- CUDA ----

func (c *cudaImpl) layerNorm(a *lnArgs, mean, rstd, w, b *tensor.Tensor, eps float32) error {
	vec := rwVecOK([]*tensor.Tensor{a.x, a.y, w, b}, a.cols, a.ldx, a.ldy)
	p := rwPlanRows(a.cols, vec)
	return c.lnFwd(a.x.DType, p, a.y, mean, rstd, a.x, w, b, a.rows, a.cols, a.ldx, a.ldy, eps)
}

// lnFwd launches ln_fwd_<inst>_<dt>.
func (c *cudaImpl) lnFwd(dt tensor.DType, p rwPlan, y, mean, rstd, x, w, b *tensor.Tensor, rows, cols, ldx, ldy int, eps float32) error {
	return c.launchK("layernorm.cu", "ln_fwd_"+p.inst+dtSuffix(dt), p.fwdGrid(rows), block1(p.threads), 0,
		kPtr(y), kPtr(mean), kPtr(rstd), kPtr(x), kPtr(w), kPtr(b),
		kI64(int64(rows)), kI32(cols), kI64(int64(ldx)), kI64(int64(ldy)), kF32(eps), kBool(p.block))
}

func (c *cudaImpl) layerNormBackward(a *lnArgs, dw, db, w, mean, rstd *tensor.Tensor, acc [3]bool) error {
	counts := []int{a.cols, a.ldx, a.ldy}
	if a.dx != nil {
		counts = append(counts, a.lddx)
	}
	vec := rwVecOK([]*tensor.Tensor{a.x, a.y, a.dx, w}, counts...)
	p := rwPlanRows(a.cols, vec)
	nb := min((a.rows+p.groups-1)/p.groups, rwMaxBlocks)
	rpb := (a.rows + nb - 1) / nb
	nb = (a.rows + rpb - 1) / rpb
	var pdw, pdb cuda.DevicePtr
	if dw != nil || db != nil {
		n := int64(nb) * int64(a.cols) * 4
		base, err := c.scratchPtr("layernorm.partials", 2*n)
		if err != nil {
			return err
		}
		if dw != nil {
			pdw = base
		}
		if db != nil {
			pdb = base.Add(n)
		}
	}
	if err := c.lnBwd(a.x.DType, p, nb, a.dx, pdw, pdb, a.y, a.x, w, mean, rstd, a.rows, a.cols, a.lddx, a.ldy, a.ldx, rpb, acc[0]); err != nil {
		return err
	}
	if dw == nil && db == nil {
		return nil
	}
	return c.lnBwdReduce(dw, db, pdw, pdb, nb, a.cols, acc[1], acc[2])
}

// lnBwd launches ln_bwd_<inst>_<dt> on nb blocks of rpb rows each; pdw and
// pdb are device addresses of [nb, cols] f32 partials (0: not wanted).
func (c *cudaImpl) lnBwd(dt tensor.DType, p rwPlan, nb int, dx *tensor.Tensor, pdw, pdb cuda.DevicePtr, dy, x, w, mean, rstd *tensor.Tensor,
	rows, cols, lddx, lddy, ldx, rpb int, accdx bool) error {
	return c.launchK("layernorm.cu", "ln_bwd_"+p.inst+dtSuffix(dt), grid1(nb), block1(p.threads), 0,
		kPtr(dx), kDev(pdw), kDev(pdb), kPtr(dy), kPtr(x), kPtr(w), kPtr(mean), kPtr(rstd),
		kI64(int64(rows)), kI32(cols), kI64(int64(lddx)), kI64(int64(lddy)), kI64(int64(ldx)), kI64(int64(rpb)),
		kBool(p.block), kBool(accdx))
}

// lnBwdReduce launches ln_bwd_reduce: dw, db (+)= the column sums of the
// [nb, cols] partials at pdw, pdb.
func (c *cudaImpl) lnBwdReduce(dw, db *tensor.Tensor, pdw, pdb cuda.DevicePtr, nb, cols int, accw, accb bool) error {
	return c.launchK("layernorm.cu", "ln_bwd_reduce", grid1((cols+31)/32), [3]uint32{32, 8, 1}, 0,
		kPtr(dw), kPtr(db), kDev(pdw), kDev(pdb), kI32(nb), kI32(cols), kBool(accw), kBool(accb))
}

// ---- graph ----

// LayerNorm records y = LayerNorm(x)·w + b over x's last dimension
// (Engine.LayerNorm; PyTorch's nn.LayerNorm(C, eps)): x [..., C] of any
// float dtype, y of x's shape and dtype, w and b f32 [C] parameters or nil
// (no affine weight, no bias). The per-row mean and rstd are saved for the
// backward, which writes (or, on fan-out, adds) the gradients of x, w and
// b in one fused pass.
func (g *Graph) LayerNorm(x, w, b *Var, eps float32) *Var {
	if !g.ok(x) {
		return nil
	}
	if err := rwFloat("layernorm x", x); err != nil {
		g.Fail("layernorm", err)
		return nil
	}
	if x.Value.Rank() < 1 {
		g.Fail("layernorm", fmt.Errorf("%w: layernorm of a scalar", tensor.ErrShape))
		return nil
	}
	rows, cols := rowsCols(x.Value)
	for _, p := range []*Var{w, b} {
		if p != nil && (p.Value.DType != tensor.F32 || !tensor.SameShape(p.Value.Shape, []int{cols})) {
			g.Fail("layernorm", fmt.Errorf("%w: layernorm parameter %s is %v %v, want f32 [%d]", tensor.ErrShape, p.Name, p.Value.DType, p.Value.Shape, cols))
			return nil
		}
	}
	in := []*Var{x}
	wi, bi := -1, -1
	if w != nil {
		wi = len(in)
		in = append(in, w)
	}
	if b != nil {
		bi = len(in)
		in = append(in, b)
	}
	y := g.NewOut("layernorm", x.Value.DType, x.Value.Shape...)
	mean := g.NewOut("layernorm.mean", tensor.F32, rows)
	rstd := g.NewOut("layernorm.rstd", tensor.F32, rows)
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
	g.Record("layernorm", in, []*Var{y, mean, rstd}, func(*Grads) error {
		return e.LayerNorm(y.Value, mean.Value, rstd.Value, x.Value, val(wi), val(bi), eps)
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
		return e.LayerNormBackward(gr.In(0), dw, db, dy, x.Value, val(wi), mean.Value, rstd.Value, acc)
	})
	return y
}
