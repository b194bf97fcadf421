package ops

// The layernorm family: layer normalisation over the last dimension, alone
// (LayerNorm) or fused with the residual add before it (AddLayerNorm), with
// fused backwards (libgpu/kernels/layernorm.cu), and Graph.LayerNorm and
// Graph.AddLayerNorm. Reference and checks: opstest/layernorm.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// lnArgs is a validated call: the row tensors viewed as [rows, C] and
// their row strides.
type lnArgs struct {
	rows, cols int
	x, y       *tensor.Tensor // forward: x (or x of x + r), y; backward: the normalised input, dy
	ldx, ldy   int
	r, sum     *tensor.Tensor // forward of AddLayerNorm: r and the stored x + r
	ldr, lds   int
	dx, dr     *tensor.Tensor // backward: dx, and dr (AddLayerNorm)
	lddx, lddr int
	gsum       *tensor.Tensor // backward of AddLayerNorm: the stored sum's own gradient
	ldg        int
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

// lnRows checks a row tensor of like's shape and dtype (like itself when
// t is like) and views it as rows, returning its row stride. A nil t is
// skipped (ld 0).
func (e *Engine) lnRows(what string, t, like *tensor.Tensor) (*tensor.Tensor, int, error) {
	if t == nil {
		return nil, 0, nil
	}
	if t != like {
		if err := e.checkView(what, t, false, []tensor.DType{like.DType}, like.Shape...); err != nil {
			return nil, 0, err
		}
	} else if err := e.checkView(what, t, false, floatTypes); err != nil {
		return nil, 0, err
	}
	v, _, _, ld, err := rwRows(what, t)
	return v, ld, err
}

// lnForward checks and runs LayerNorm (r, sum nil) or AddLayerNorm.
func (e *Engine) lnForward(op string, y, mean, rstd, x, r, sum, w, b *tensor.Tensor, eps float32) error {
	if !(eps >= 0) || math.IsInf(float64(eps), 1) {
		return fmt.Errorf("%w: %s eps %v", ErrConfig, op, eps)
	}
	if x == nil {
		return fmt.Errorf("%w: %s x is missing", tensor.ErrShape, op)
	}
	var a lnArgs
	var err error
	if a.x, a.ldx, err = e.lnRows(op+" x", x, x); err != nil {
		return err
	}
	a.rows, a.cols = rowsCols(x)
	if x.Rank() == 0 {
		return fmt.Errorf("%w: %s x is a scalar, want [..., C]", tensor.ErrShape, op)
	}
	if y == nil {
		return fmt.Errorf("%w: %s y is missing", tensor.ErrShape, op)
	}
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
	if err := e.checkLNParam(op+" b", b, a.cols); err != nil {
		return err
	}
	for _, st := range []struct {
		what string
		t    *tensor.Tensor
	}{{op + " mean", mean}, {op + " rstd", rstd}} {
		if st.t == nil {
			continue
		}
		if err := e.checkLNStats(st.what, st.t, a.rows); err != nil {
			return err
		}
	}
	if a.rows == 0 || a.cols == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostLayerNorm(&a, mean, rstd, w, b, eps) },
		func(c *cudaImpl) error { return c.layerNorm(&a, mean, rstd, w, b, eps) })
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
// tensor.ErrLayout, exec.ErrDevice or ErrConfig (eps negative or NaN).
func (e *Engine) LayerNorm(y, mean, rstd, x, w, b *tensor.Tensor, eps float32) error {
	return e.lnForward("layernorm", y, mean, rstd, x, nil, nil, w, b, eps)
}

// AddLayerNorm is a residual add and the LayerNorm after it in one pass (a
// pre-LN transformer block's x = x + a; h = LN(x)):
//
//	sum = x + r (rounded to the dtype: the value stored),  y = LayerNorm(sum)
//
// x, r, sum and y: [..., C], one shape and dtype (f32 or bf16), rows may be
// strided as for LayerNorm; sum may be x or r itself (an in-place residual
// update). y is the LayerNorm of the stored sum, so AddLayerNormBackward
// (which reads sum) matches it exactly. w, b, mean, rstd, eps and errors as
// LayerNorm. The CUDA kernel reads x and r once and writes sum and y once.
func (e *Engine) AddLayerNorm(sum, y, mean, rstd, x, r, w, b *tensor.Tensor, eps float32) error {
	if r == nil || sum == nil {
		return fmt.Errorf("%w: addlayernorm needs r and sum", tensor.ErrShape)
	}
	return e.lnForward("addlayernorm", y, mean, rstd, x, r, sum, w, b, eps)
}

// lnBackward checks and runs LayerNormBackward (gsum, dr nil) or
// AddLayerNormBackward.
func (e *Engine) lnBackward(op string, dx, dr, dw, db, dy, gsum, x, w, mean, rstd *tensor.Tensor, acc [4]bool) error {
	if x == nil {
		return fmt.Errorf("%w: %s input is missing", tensor.ErrShape, op)
	}
	var a lnArgs
	var err error
	if a.x, a.ldx, err = e.lnRows(op+" input", x, x); err != nil {
		return err
	}
	if x.Rank() == 0 {
		return fmt.Errorf("%w: %s input is a scalar, want [..., C]", tensor.ErrShape, op)
	}
	a.rows, a.cols = rowsCols(x)
	if dy == nil {
		return fmt.Errorf("%w: %s dy is missing", tensor.ErrShape, op)
	}
	if a.y, a.ldy, err = e.lnRows(op+" dy", dy, x); err != nil {
		return err
	}
	if a.gsum, a.ldg, err = e.lnRows(op+" dsum", gsum, x); err != nil {
		return err
	}
	if a.dx, a.lddx, err = e.lnRows(op+" dx", dx, x); err != nil {
		return err
	}
	if a.dr, a.lddr, err = e.lnRows(op+" dr", dr, x); err != nil {
		return err
	}
	if dx != nil && dr != nil && dx.Buf == dr.Buf {
		// Both are written from one value t per element; overlapping,
		// accumulation would add t once.
		if lo0, hi0, lo1, hi1 := dx.Offset, dx.Offset+dx.Extent(), dr.Offset, dr.Offset+dr.Extent(); lo0 < hi1 && lo1 < hi0 {
			return fmt.Errorf("%w: %s dx and dr overlap", tensor.ErrLayout, op)
		}
	}
	for _, p := range []struct {
		what string
		t    *tensor.Tensor
	}{{op + " w", w}, {op + " dw", dw}, {op + " db", db}} {
		if err := e.checkLNParam(p.what, p.t, a.cols); err != nil {
			return err
		}
	}
	if err := e.checkLNStats(op+" mean", mean, a.rows); err != nil {
		return err
	}
	if err := e.checkLNStats(op+" rstd", rstd, a.rows); err != nil {
		return err
	}
	if a.cols == 0 || (dx == nil && dr == nil && dw == nil && db == nil) {
		return nil
	}
	if a.rows == 0 {
		// No rows: dx and dr are empty; the parameter gradients are sums of nothing.
		for i, t := range []*tensor.Tensor{dw, db} {
			if t != nil && !acc[i+2] {
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

// LayerNormBackward computes the gradients of LayerNorm from dy (the
// gradient of y), x, w and the saved mean and rstd, with x̂ = (x−μ)·rstd
// and g = dy·w:
//
//	dx = rstd·(g − Σg/C − x̂·Σ(g·x̂)/C)     (per row, sums over the row)
//	dw = Σ_rows dy·x̂,  db = Σ_rows dy
//
// Shapes and dtypes as LayerNorm: dx and dy of x's shape and dtype (rows
// may be strided; dx may be dy); w f32 [C] or nil (ones); mean, rstd as
// LayerNorm wrote them; dw and db f32 [C]. Any of dx, dw, db may be nil
// (not wanted). acc[0], acc[1], acc[2] add dx, dw, db to what those tensors
// hold instead of overwriting it. On CUDA one kernel computes dx and the
// parameter gradients: each block sums its rows into a row of partials
// and the last blocks to finish fold the partials in a fixed order (a
// ticket on a device counter): no float atomics, the same bits on every
// run. Errors as LayerNorm.
func (e *Engine) LayerNormBackward(dx, dw, db, dy, x, w, mean, rstd *tensor.Tensor, acc [3]bool) error {
	return e.lnBackward("layernorm backward", dx, nil, dw, db, dy, nil, x, w, mean, rstd, [4]bool{acc[0], false, acc[1], acc[2]})
}

// AddLayerNormBackward computes the gradients of AddLayerNorm: with d the
// LayerNorm gradient of sum from dy (LayerNormBackward's dx, computed from
// the stored sum), and dsum the gradient that reaches sum itself from its
// other consumers (nil: none),
//
//	t = dsum + d,  dx = t,  dr = t,  dw = Σ_rows dy·ŝ,  db = Σ_rows dy
//
// (sum = x + r hands its gradient to both). Shapes and dtypes as
// AddLayerNorm; dx, dr, dw, db may each be nil (not wanted); dx or dr may
// be dsum or dy, but dx and dr must not overlap. acc[0..3] add dx, dr, dw,
// db to what those tensors hold. One pass on CUDA (reads dy, dsum and sum,
// writes dx and dr). Errors as AddLayerNorm.
func (e *Engine) AddLayerNormBackward(dx, dr, dw, db, dy, dsum, sum, w, mean, rstd *tensor.Tensor, acc [4]bool) error {
	return e.lnBackward("addlayernorm backward", dx, dr, dw, db, dy, dsum, sum, w, mean, rstd, acc)
}

// ---- host ----

func hostLayerNorm(a *lnArgs, mean, rstd, w, b *tensor.Tensor, eps float32) error {
	xs, err := hostIn(a.x)
	if err != nil {
		return err
	}
	if a.r != nil {
		// sum = x + r, rounded to the dtype as it is stored; normalise that.
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
	ins, err := hostIns(w, b)
	if err != nil {
		return err
	}
	ws, bs := ins[0], ins[1]
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

func hostLayerNormBackward(a *lnArgs, dw, db, w, mean, rstd *tensor.Tensor, acc [4]bool) error {
	ins, err := hostIns(a.x, a.y, w, mean, rstd)
	if err != nil {
		return err
	}
	xs, gs, ws, ms, rs := ins[0], ins[1], ins[2], ins[3], ins[4]
	var gsum []float32
	if a.gsum != nil {
		// Copied: dx or dr may be the same memory.
		if gsum, err = a.gsum.ReadFloat32(); err != nil {
			return err
		}
	}
	C := a.cols
	t := make([]float32, a.rows*C)
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
		m1, m2 := s1/float64(C), s2/float64(C)
		for j := 0; j < C; j++ {
			t[r*C+j] = float32(inv * (gw[j] - m1 - xh[j]*m2))
			if gsum != nil {
				t[r*C+j] += gsum[r*C+j]
			}
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
		copy(out, t)
		if err := commit(); err != nil {
			return err
		}
	}
	if err := hostOut64(dw, acc[2], sw); err != nil {
		return err
	}
	return hostOut64(db, acc[3], sb)
}

// ---- CUDA ----

func lnBool(v bool) int32 {
	if v {
		return 1
	}
	return 0
}

// lnFastShapes are the fast kernels' (V, NV) instances in the order they
// are tried: fewest elements per lane (V·NV) first, then wider vectors.
var lnFastShapes = [][2]int{{4, 1}, {8, 1}, {4, 2}, {4, 3}, {8, 2}, {4, 4}, {8, 3}, {8, 4}}

// lnFast picks the fast kernels' instance ("v<V>n<NV>") for rows of C
// elements of dt: the first of lnFastShapes whose lanes hold a row (C ≤
// 32·V·NV) with C, every count (row strides) a multiple of V, every
// present row tensor of ts aligned to V elements (16 bytes at most) and
// every f32 parameter of ts (w, b: read as 16-byte vectors) to 16 bytes.
// ok is false when none fits (C > 1024, or no vector width divides the
// layout).
func lnFast(dt tensor.DType, C int, ts []*tensor.Tensor, counts ...int) (inst string, ok bool) {
	for _, sh := range lnFastShapes {
		v, nv := sh[0], sh[1]
		if C > 32*v*nv || C%v != 0 {
			continue
		}
		fits := true
		for _, t := range ts {
			align := uintptr(min(16, v*dt.Size()))
			if t != nil && t.DType != dt {
				align = 16
			}
			if t != nil && t.Ptr()%align != 0 {
				fits = false
			}
		}
		for _, n := range counts {
			if n%v != 0 {
				fits = false
			}
		}
		if fits {
			return fmt.Sprintf("v%dn%d", v, nv), true
		}
	}
	return "", false
}

// lnKernels are the layernorm.cu kernels a LayerNorm (add: AddLayerNorm)
// of rows of cols elements of dt launches, its tensors aligned and
// contiguous as a Graph's are: the forward's and, with backward, the
// backward's (what Graph.LayerNorm prefetches; layerNorm and
// layerNormBackward choose the same way).
func lnKernels(dt tensor.DType, cols int, add, backward bool) []launch.Kernel {
	var fwd, bwd func(string) (launch.Kernel, error)
	inst, ok := lnFast(dt, cols, nil, cols)
	if ok {
		fwd, bwd = launch.LnFwdfKernel, launch.LnBwdfKernel
		if add {
			fwd = launch.LnAddfKernel
		}
	} else {
		inst = rwPlanRows(cols, cols%rwVecWidth == 0).inst
		fwd, bwd = launch.LnFwdKernel, launch.LnBwdKernel
	}
	inst += "_" + dtName(dt)
	if !backward {
		bwd = nil
	}
	var ks []launch.Kernel
	for _, f := range []func(string) (launch.Kernel, error){fwd, bwd} {
		if f == nil {
			continue
		}
		if k, err := f(inst); err == nil {
			ks = append(ks, k)
		}
	}
	return ks
}

// lnFastThreads is LNF_THREADS: the fast kernels' block.
const lnFastThreads = 256

func (c *cudaImpl) layerNorm(a *lnArgs, mean, rstd, w, b *tensor.Tensor, eps float32) error {
	k := launch.LnArgs{Y: devPtr(a.y), X: devPtr(a.x), W: devPtr(w), B: devPtr(b), Mean: devPtr(mean), Rstd: devPtr(rstd),
		Rows: int64(a.rows), Ldy: int64(a.ldy), Ldx: int64(a.ldx), C: int32(a.cols), Eps: eps}
	if a.r != nil {
		k.R, k.Sum, k.Ldr, k.Lds = devPtr(a.r), devPtr(a.sum), int64(a.ldr), int64(a.lds)
	}
	ts := []*tensor.Tensor{a.x, a.y, a.r, a.sum, w, b}
	counts := []int{a.cols, a.ldx, a.ldy, a.ldr, a.lds}
	dt := a.x.DType
	if inst, ok := lnFast(dt, a.cols, ts, counts...); ok {
		inst += "_" + dtName(dt)
		kernel, named := launch.LnFwdf, launch.LnFwdfKernel
		if a.r != nil {
			kernel, named = launch.LnAddf, launch.LnAddfKernel
		}
		kn, err := named(inst)
		if err != nil {
			return err
		}
		n, err := c.ResidentGrid(kn, lnFastThreads, 0)
		if err != nil {
			return err
		}
		warps := lnFastThreads / 32
		return kernel(c, inst, grid1(min(n, (a.rows+warps-1)/warps)), block1(lnFastThreads), 0, &k)
	}
	p := rwPlanRows(a.cols, rwVecOK(ts, counts...))
	k.Block = lnBool(p.block)
	return launch.LnFwd(c, p.inst+"_"+dtName(dt), p.fwdGrid(a.rows), block1(p.threads), 0, &k)
}

func (c *cudaImpl) layerNormBackward(a *lnArgs, dw, db, w, mean, rstd *tensor.Tensor, acc [4]bool) error {
	k := launch.LnArgs{X: devPtr(a.x), Dy: devPtr(a.y), Gsum: devPtr(a.gsum), Dx: devPtr(a.dx), Dr: devPtr(a.dr),
		W: devPtr(w), Mean: devPtr(mean), Rstd: devPtr(rstd), Dw: devPtr(dw), Db: devPtr(db),
		Rows: int64(a.rows), Ldx: int64(a.ldx), Lddy: int64(a.ldy), Ldg: int64(a.ldg), Lddx: int64(a.lddx), Lddr: int64(a.lddr),
		C: int32(a.cols), AccDx: lnBool(acc[0]), AccDr: lnBool(acc[1]), AccW: lnBool(acc[2]), AccB: lnBool(acc[3])}
	ts := []*tensor.Tensor{a.x, a.y, a.gsum, a.dx, a.dr, w}
	counts := []int{a.cols, a.ldx, a.ldy}
	for _, t := range []struct {
		t  *tensor.Tensor
		ld int
	}{{a.gsum, a.ldg}, {a.dx, a.lddx}, {a.dr, a.lddr}} {
		if t.t != nil {
			counts = append(counts, t.ld)
		}
	}
	dt := a.x.DType
	var inst string
	kernel := launch.LnBwd
	var grid [3]uint32
	var threads int
	var smem uint32
	if fast, ok := lnFast(dt, a.cols, ts, counts...); ok {
		inst, kernel = fast+"_"+dtName(dt), launch.LnBwdf
		threads = lnFastThreads
		smem = uint32(lnFastThreads / 32 * 2 * a.cols * 4) // each warp's partial dw and db
		kn, err := launch.LnBwdfKernel(inst)
		if err != nil {
			return err
		}
		n, err := c.ResidentGrid(kn, threads, smem)
		if err != nil {
			return err
		}
		grid = grid1(min(n, (a.rows+threads/32-1)/(threads/32)))
	} else {
		p := rwPlanRows(a.cols, rwVecOK(ts, counts...))
		inst, threads, k.Block = p.inst+"_"+dtName(dt), p.threads, lnBool(p.block)
		grid = grid1(min((a.rows+p.groups-1)/p.groups, rwMaxBlocks))
	}
	nb := int(grid[0])
	rpb := (a.rows + nb - 1) / nb
	nb = (a.rows + rpb - 1) / rpb
	k.Rpb = int64(rpb)
	if dw != nil || db != nil {
		// The fold's groups: about √nb blocks each, so the last group's
		// fold and the final one are about as long.
		s := int(math.Ceil(math.Sqrt(float64(nb))))
		ng := (nb + s - 1) / s
		part, err := c.Scratch("layernorm.partials", int64(nb+ng)*int64(2*a.cols)*4)
		if err != nil {
			return err
		}
		tickets, err := c.Tickets("layernorm.tickets", ng+1)
		if err != nil {
			return err
		}
		k.Part, k.Tickets, k.Group = part, tickets, int32(s)
	}
	return kernel(c, inst, grid1(nb), block1(threads), smem, &k)
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
	if !g.lnParams("layernorm", cols, w, b) {
		return nil
	}
	g.prefetchKernels(lnKernels(x.Value.DType, cols, false, g.opts.Train)...)
	in, wi, bi := withAffine([]*Var{x}, w, b)
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

// AddLayerNorm records sum = x + r and y = LayerNorm(sum)·w + b in one op
// (Engine.AddLayerNorm): a pre-LN transformer block's residual update and
// the norm after it, x = x + a; h = LN(x), as sum, y = AddLayerNorm(x, a,
// ...). x and r of one shape and float dtype; sum and y of that shape and
// dtype; w, b f32 [C] or nil. The backward (Engine.AddLayerNormBackward)
// gives x and r the same gradient: sum's own (from its other consumers,
// e.g. the next residual add) plus the LayerNorm's, in one pass, and adds
// dw, db (fan-out accumulates as everywhere). With x and r the same Var it
// records Scale(x, 2) and LayerNorm (x + x = 2x exactly).
func (g *Graph) AddLayerNorm(x, r, w, b *Var, eps float32) (sum, y *Var) {
	if !g.ok(x, r) {
		return nil, nil
	}
	if err := rwFloat("addlayernorm x", x); err != nil {
		g.Fail("addlayernorm", err)
		return nil, nil
	}
	if !tensor.SameShape(x.Value.Shape, r.Value.Shape) || x.Value.DType != r.Value.DType || x.Value.Rank() < 1 {
		g.Fail("addlayernorm", fmt.Errorf("%w: addlayernorm of %v %v and %v %v", tensor.ErrShape, x.Value.DType, x.Value.Shape, r.Value.DType, r.Value.Shape))
		return nil, nil
	}
	if x == r {
		s := g.Scale(x, 2)
		return s, g.LayerNorm(s, w, b, eps)
	}
	rows, cols := rowsCols(x.Value)
	if !g.lnParams("addlayernorm", cols, w, b) {
		return nil, nil
	}
	g.prefetchKernels(lnKernels(x.Value.DType, cols, true, g.opts.Train)...)
	in, wi, bi := withAffine([]*Var{x, r}, w, b)
	sum = g.NewOut("addlayernorm.sum", x.Value.DType, x.Value.Shape...)
	y = g.NewOut("addlayernorm", x.Value.DType, x.Value.Shape...)
	mean := g.NewOut("addlayernorm.mean", tensor.F32, rows)
	rstd := g.NewOut("addlayernorm.rstd", tensor.F32, rows)
	if !g.ok(sum, y, mean, rstd) {
		return nil, nil
	}
	val := func(i int) *tensor.Tensor {
		if i < 0 {
			return nil
		}
		return in[i].Value
	}
	e := g.e
	g.Record("addlayernorm", in, []*Var{sum, y, mean, rstd}, func(*Grads) error {
		return e.AddLayerNorm(sum.Value, y.Value, mean.Value, rstd.Value, x.Value, r.Value, val(wi), val(bi), eps)
	}, func(gr *Grads) error {
		dsum, dy := gr.Out(0), gr.Out(1)
		dx, dr := gr.In(0), gr.In(1)
		var dw, db *tensor.Tensor
		acc := [4]bool{gr.Acc(0), gr.Acc(1)}
		if wi >= 0 {
			dw, acc[2] = gr.In(wi), gr.Acc(wi)
		}
		if bi >= 0 {
			db, acc[3] = gr.In(bi), gr.Acc(bi)
		}
		if dy == nil {
			// Only sum's own gradient: it passes to x and r; w and b get
			// none (zero).
			for i, d := range []*tensor.Tensor{dw, db} {
				if d != nil && !acc[i+2] {
					if err := e.Fill(d, 0); err != nil {
						return err
					}
				}
			}
			for i, d := range []*tensor.Tensor{dx, dr} {
				if d != nil && dsum != nil {
					if err := e.Scale(d, dsum, 1, acc[i]); err != nil {
						return err
					}
				} else if d != nil && !acc[i] {
					if err := e.Fill(d, 0); err != nil {
						return err
					}
				}
			}
			return nil
		}
		return e.AddLayerNormBackward(dx, dr, dw, db, dy, dsum, sum.Value, val(wi), mean.Value, rstd.Value, acc)
	})
	return sum, y
}

// withAffine is an op's inputs in followed by w and b where given, with
// their indices (−1 where absent).
func withAffine(in []*Var, w, b *Var) (all []*Var, wi, bi int) {
	wi, bi = -1, -1
	if w != nil {
		wi = len(in)
		in = append(in, w)
	}
	if b != nil {
		bi = len(in)
		in = append(in, b)
	}
	return in, wi, bi
}

// lnParams fails the graph unless w and b (each optional) are f32 [cols].
func (g *Graph) lnParams(op string, cols int, ps ...*Var) bool {
	for _, p := range ps {
		if p != nil && (p.Value.DType != tensor.F32 || !tensor.SameShape(p.Value.Shape, []int{cols})) {
			g.Fail(op, fmt.Errorf("%w: %s parameter %s is %v %v, want f32 [%d]", tensor.ErrShape, op, p.Name, p.Value.DType, p.Value.Shape, cols))
			return false
		}
	}
	return true
}
