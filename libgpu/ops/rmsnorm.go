package ops

// The rmsnorm family: root-mean-square normalisation over the last
// dimension (Zhang & Sennrich 2019, "Root Mean Square Layer
// Normalization"), alone (RMSNorm) or after a residual add (AddRMSNorm,
// the post-norm block of sapientinc/HRM: h = rms_norm(h + f(h))), with an
// optional f32 weight, forward and backward (libgpu/kernels/rmsnorm.cu),
// and Graph.RMSNorm and Graph.AddRMSNorm. Reference and checks:
// opstest/rmsnorm.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// rmsArgs is a validated call: every row tensor viewed as [rows, C] with
// its row stride.
type rmsArgs struct {
	rows, cols   int
	x, y, r, sum *tensor.Tensor // forward: x, y, r, sum; backward: x (the normalised input), dy in y
	ldx, ldy     int
	ldr, lds     int
	dx, dr       *tensor.Tensor // backward
	lddx, lddr   int
}

func (e *Engine) rmsForward(op string, y, rstd, x, r, sum, w *tensor.Tensor, eps float32) error {
	if !(eps >= 0) || math.IsInf(float64(eps), 1) {
		return fmt.Errorf("%w: %s eps %v", ErrConfig, op, eps)
	}
	if x == nil || y == nil {
		return fmt.Errorf("%w: %s x or y is missing", tensor.ErrShape, op)
	}
	if x.Rank() == 0 {
		return fmt.Errorf("%w: %s x is a scalar, want [..., C]", tensor.ErrShape, op)
	}
	var a rmsArgs
	var err error
	if a.x, a.ldx, err = e.lnRows(op+" x", x, x); err != nil {
		return err
	}
	a.rows, a.cols = rowsCols(x)
	if a.y, a.ldy, err = e.lnRows(op+" y", y, x); err != nil {
		return err
	}
	if a.r, a.ldr, err = e.lnRows(op+" r", r, x); err != nil {
		return err
	}
	if a.sum, a.lds, err = e.lnRows(op+" sum", sum, x); err != nil {
		return err
	}
	if err := e.checkLNParam(op+" w", w, a.cols); err != nil {
		return err
	}
	if rstd != nil {
		if err := e.checkLNStats(op+" rstd", rstd, a.rows); err != nil {
			return err
		}
	}
	if err := checkDims(a.cols); err != nil {
		return err
	}
	if a.rows == 0 || a.cols == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostRMSNorm(&a, rstd, w, eps) },
		func(c *cudaImpl) error { return c.rmsNorm(&a, rstd, w, eps) })
}

// RMSNorm normalises every row of x over its last dimension C by its root
// mean square (Zhang & Sennrich 2019; sapientinc/HRM's rms_norm, which has
// no weight; PyTorch's nn.RMSNorm with one):
//
//	rstd = 1/√(Σx²/C + eps),  y = x·rstd·w
//
// x and y: [..., C], one shape and one dtype (f32 or bf16), rows may be
// strided as for LayerNorm (leading dimensions merging into one row
// stride, last dimension contiguous); y may be x. w: f32 [C], or nil (no
// weight: ones). rstd: f32, contiguous, one element per row (any shape),
// saved for RMSNormBackward; nil when no backward follows. Computed in
// f32, as HRM does (x.to(float32) before the mean). Errors wrap
// tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or
// ErrConfig (eps negative or NaN).
func (e *Engine) RMSNorm(y, rstd, x, w *tensor.Tensor, eps float32) error {
	return e.rmsForward("rmsnorm", y, rstd, x, nil, nil, w, eps)
}

// AddRMSNorm is a residual add and the RMSNorm after it in one pass
// (HRM's post-norm h = rms_norm(h + f(h))):
//
//	sum = x + r (rounded to the dtype: the value stored),  y = RMSNorm(sum)
//
// x, r, sum and y: [..., C], one shape and dtype (f32 or bf16), rows may
// be strided; sum may be x or r (an in-place update). w, rstd, eps and the
// errors as RMSNorm. RMSNormBackward of the stored sum is its backward
// (dx and dr are both the gradient of sum).
func (e *Engine) AddRMSNorm(sum, y, rstd, x, r, w *tensor.Tensor, eps float32) error {
	if r == nil || sum == nil {
		return fmt.Errorf("%w: addrmsnorm needs r and sum", tensor.ErrShape)
	}
	return e.rmsForward("addrmsnorm", y, rstd, x, r, sum, w, eps)
}

// RMSNormBackward computes the gradients of RMSNorm from dy, the
// normalised input x (for AddRMSNorm: the stored sum), w and the saved
// rstd, with x̂ = x·rstd and g = dy·w:
//
//	dx = rstd·(g − x̂·Σ(g·x̂)/C)      (per row)
//	dw = Σ_rows dy·x̂
//
// dx and dy of x's shape and dtype (rows may be strided; dx may be dy); dr,
// when not nil, receives a second copy of dx (AddRMSNorm's r; it must not
// overlap dx); dw f32 [C], or nil (no weight, or not wanted: w nil and dw
// set is an error). acc[0], acc[1], acc[2] add dx, dr, dw to what those
// hold. On CUDA dw is a column sum of per-row products written to scratch
// (deterministic, no atomics). Errors as RMSNorm.
func (e *Engine) RMSNormBackward(dx, dr, dw, dy, x, w, rstd *tensor.Tensor, acc [3]bool) error {
	const op = "rmsnorm backward"
	if x == nil || dy == nil {
		return fmt.Errorf("%w: %s x or dy is missing", tensor.ErrShape, op)
	}
	if x.Rank() == 0 {
		return fmt.Errorf("%w: %s x is a scalar, want [..., C]", tensor.ErrShape, op)
	}
	var a rmsArgs
	var err error
	if a.x, a.ldx, err = e.lnRows(op+" x", x, x); err != nil {
		return err
	}
	a.rows, a.cols = rowsCols(x)
	if a.y, a.ldy, err = e.lnRows(op+" dy", dy, x); err != nil {
		return err
	}
	if a.dx, a.lddx, err = e.lnRows(op+" dx", dx, x); err != nil {
		return err
	}
	if a.dr, a.lddr, err = e.lnRows(op+" dr", dr, x); err != nil {
		return err
	}
	if dx != nil && dr != nil && dx.Buf == dr.Buf {
		if lo0, hi0, lo1, hi1 := dx.Offset, dx.Offset+dx.Extent(), dr.Offset, dr.Offset+dr.Extent(); lo0 < hi1 && lo1 < hi0 {
			return fmt.Errorf("%w: %s dx and dr overlap", tensor.ErrLayout, op)
		}
	}
	if err := e.checkLNParam(op+" w", w, a.cols); err != nil {
		return err
	}
	if err := e.checkLNParam(op+" dw", dw, a.cols); err != nil {
		return err
	}
	if dw != nil && w == nil {
		return fmt.Errorf("%w: %s dw without a weight", tensor.ErrShape, op)
	}
	if err := e.checkLNStats(op+" rstd", rstd, a.rows); err != nil {
		return err
	}
	if err := checkDims(a.cols); err != nil {
		return err
	}
	if a.cols == 0 || (dx == nil && dr == nil && dw == nil) {
		return nil
	}
	if a.rows == 0 {
		if dw != nil && !acc[2] {
			return e.Fill(dw, 0)
		}
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostRMSNormBackward(&a, dw, w, rstd, acc) },
		func(c *cudaImpl) error { return c.rmsNormBackward(&a, dw, w, rstd, acc) })
}

// ---- host ----

func hostRMSNorm(a *rmsArgs, rstd, w *tensor.Tensor, eps float32) error {
	xs, err := hostIn(a.x)
	if err != nil {
		return err
	}
	if a.r != nil {
		rs, err := hostIn(a.r)
		if err != nil {
			return err
		}
		ss := make([]float32, len(xs))
		for i := range ss {
			ss[i] = xs[i] + rs[i]
		}
		if err := a.sum.WriteFloat32(ss); err != nil {
			return err
		}
		if xs, err = a.sum.ReadFloat32(); err != nil {
			return err
		}
	}
	ws, err := hostIn(w)
	if err != nil {
		return err
	}
	ys, commit, err := hostOut(a.y, false)
	if err != nil {
		return err
	}
	rsOut, rCommit, err := hostOut(rstd, false)
	if err != nil {
		return err
	}
	C := a.cols
	for r := 0; r < a.rows; r++ {
		row := xs[r*C : (r+1)*C]
		var q float64
		for _, v := range row {
			q += float64(v) * float64(v)
		}
		inv := 1 / math.Sqrt(q/float64(C)+float64(eps))
		for j, v := range row {
			o := float64(v) * inv
			if ws != nil {
				o *= float64(ws[j])
			}
			ys[r*C+j] = float32(o)
		}
		if rsOut != nil {
			rsOut[r] = float32(inv)
		}
	}
	if err := rCommit(); err != nil {
		return err
	}
	return commit()
}

func hostRMSNormBackward(a *rmsArgs, dw, w, rstd *tensor.Tensor, acc [3]bool) error {
	ins, err := hostIns(a.x, a.y, w, rstd)
	if err != nil {
		return err
	}
	xs, gs, ws, rs := ins[0], ins[1], ins[2], ins[3]
	C := a.cols
	d := make([]float32, a.rows*C)
	sw := make([]float64, C)
	xh := make([]float64, C)
	gw := make([]float64, C)
	for r := 0; r < a.rows; r++ {
		inv := float64(rs[r])
		var s float64
		for j := 0; j < C; j++ {
			dy := float64(gs[r*C+j])
			xh[j] = float64(xs[r*C+j]) * inv
			gw[j] = dy
			if ws != nil {
				gw[j] *= float64(ws[j])
			}
			s += gw[j] * xh[j]
			sw[j] += dy * xh[j]
		}
		m := s / float64(C)
		for j := 0; j < C; j++ {
			d[r*C+j] = float32(inv * (gw[j] - xh[j]*m))
		}
	}
	for i, o := range []*tensor.Tensor{a.dx, a.dr} {
		if o == nil {
			continue
		}
		out, commit, err := hostOut(o, acc[i])
		if err != nil {
			return err
		}
		copy(out, d)
		if err := commit(); err != nil {
			return err
		}
	}
	return hostOut64(dw, acc[2], sw)
}

// ---- CUDA ----

func (c *cudaImpl) rmsNorm(a *rmsArgs, rstd, w *tensor.Tensor, eps float32) error {
	k := launch.RmsArgs{Y: devPtr(a.y), X: devPtr(a.x), W: devPtr(w), Rstd: devPtr(rstd), Rows: int64(a.rows),
		Ldy: int64(a.ldy), Ldx: int64(a.ldx), C: int32(a.cols), Eps: eps}
	if a.r != nil {
		k.R, k.Sum, k.Ldr, k.Lds = devPtr(a.r), devPtr(a.sum), int64(a.ldr), int64(a.lds)
	}
	vec := rwVecOK([]*tensor.Tensor{a.x, a.y, a.r, a.sum, w}, a.cols, a.ldx, a.ldy, a.ldr, a.lds)
	p := rwPlanRows(a.cols, vec)
	k.Block = lnBool(p.block)
	return launch.RmsFwd(c, p.inst+"_"+dtName(a.x.DType), p.fwdGrid(a.rows), block1(p.threads), 0, &k)
}

func (c *cudaImpl) rmsNormBackward(a *rmsArgs, dw, w, rstd *tensor.Tensor, acc [3]bool) error {
	k := launch.RmsArgs{X: devPtr(a.x), Dy: devPtr(a.y), Dx: devPtr(a.dx), Dr: devPtr(a.dr), W: devPtr(w), Rstd: devPtr(rstd),
		Rows: int64(a.rows), Ldx: int64(a.ldx), Lddy: int64(a.ldy), Lddx: int64(a.lddx), Lddr: int64(a.lddr),
		C: int32(a.cols), AccDx: lnBool(acc[0]), AccDr: lnBool(acc[1])}
	if dw != nil {
		gw, err := c.Scratch("rmsnorm.gw", int64(a.rows)*int64(a.cols)*4)
		if err != nil {
			return err
		}
		k.Gw = gw
	}
	ts := []*tensor.Tensor{a.x, a.y, a.dx, a.dr, w}
	counts := []int{a.cols, a.ldx, a.ldy}
	if a.dx != nil {
		counts = append(counts, a.lddx)
	}
	if a.dr != nil {
		counts = append(counts, a.lddr)
	}
	p := rwPlanRows(a.cols, rwVecOK(ts, counts...))
	k.Block = lnBool(p.block)
	if err := launch.RmsBwd(c, p.inst+"_"+dtName(a.x.DType), p.fwdGrid(a.rows), block1(p.threads), 0, &k); err != nil {
		return err
	}
	if dw == nil {
		return nil
	}
	return c.mmColsum(tensor.F32, devPtr(dw), k.Gw, int64(a.rows), a.cols, a.cols, acc[2])
}

// ---- graph ----

// RMSNorm records y = RMSNorm(x)·w over x's last dimension
// (Engine.RMSNorm; HRM's rms_norm(x, eps) with w nil): x [..., C] of any
// float dtype, y of x's shape and dtype, w an f32 [C] parameter or nil.
// The per-row rstd is saved for the backward, which writes (or, on
// fan-out, adds) the gradients of x and w.
func (g *Graph) RMSNorm(x, w *Var, eps float32) *Var {
	return g.rmsNorm("rmsnorm", x, nil, w, eps)
}

// AddRMSNorm records y = RMSNorm(x + r)·w in one op (Engine.AddRMSNorm):
// HRM's post-norm residual h = rms_norm(h + f(h), eps) as
// AddRMSNorm(h, f(h), nil, eps). x and r of one shape and float dtype, y
// of that shape and dtype. The sum is stored for the backward (it is not
// a Var: nothing else reads it), which gives x and r the same gradient.
func (g *Graph) AddRMSNorm(x, r, w *Var, eps float32) *Var {
	if !g.ok(x, r) {
		return nil
	}
	if !tensor.SameShape(x.Value.Shape, r.Value.Shape) || x.Value.DType != r.Value.DType {
		g.Fail("addrmsnorm", fmt.Errorf("%w: addrmsnorm of %v %v and %v %v", tensor.ErrShape, x.Value.DType, x.Value.Shape, r.Value.DType, r.Value.Shape))
		return nil
	}
	if x == r {
		return g.RMSNorm(g.Scale(x, 2), w, eps)
	}
	return g.rmsNorm("addrmsnorm", x, r, w, eps)
}

func (g *Graph) rmsNorm(op string, x, r, w *Var, eps float32) *Var {
	if !g.ok(x) {
		return nil
	}
	if err := rwFloat(op+" x", x); err != nil {
		g.Fail(op, err)
		return nil
	}
	if x.Value.Rank() < 1 {
		g.Fail(op, fmt.Errorf("%w: %s of a scalar", tensor.ErrShape, op))
		return nil
	}
	rows, cols := rowsCols(x.Value)
	if !g.lnParams(op, cols, w) {
		return nil
	}
	in := []*Var{x}
	if r != nil {
		in = append(in, r)
	}
	in, wi, _ := withAffine(in, w, nil)
	y := g.NewOut(op, x.Value.DType, x.Value.Shape...)
	rstd := g.NewOut(op+".rstd", tensor.F32, rows)
	outs := []*Var{y, rstd}
	var sum *Var
	if r != nil {
		sum = g.NewOut(op+".sum", x.Value.DType, x.Value.Shape...)
		outs = append(outs, sum)
	}
	if !g.ok(outs...) {
		return nil
	}
	wv := func() *tensor.Tensor {
		if wi < 0 {
			return nil
		}
		return in[wi].Value
	}
	e := g.e
	g.Record(op, in, outs, func(*Grads) error {
		if r != nil {
			return e.AddRMSNorm(sum.Value, y.Value, rstd.Value, x.Value, r.Value, wv(), eps)
		}
		return e.RMSNorm(y.Value, rstd.Value, x.Value, wv(), eps)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		norm := x.Value
		var dr *tensor.Tensor
		acc := [3]bool{gr.Acc(0), false, false}
		if r != nil {
			norm, dr, acc[1] = sum.Value, gr.In(1), gr.Acc(1)
		}
		var dw *tensor.Tensor
		if wi >= 0 {
			dw, acc[2] = gr.In(wi), gr.Acc(wi)
		}
		if dy == nil {
			return nil
		}
		return e.RMSNormBackward(gr.In(0), dr, dw, dy, norm, wv(), rstd.Value, acc)
	})
	return y
}
