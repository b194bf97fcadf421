package ops

// The softmax family: softmax over the last dimension and its backward
// (libgpu/kernels/softmax.cu), and Graph.Softmax. Reference and checks:
// opstest/softmax.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// smArgs is a validated Softmax or SoftmaxBackward call, every tensor
// viewed as [rows, C] with its row stride.
type smArgs struct {
	rows, cols  int
	a, b, out   *tensor.Tensor // forward: x, -, y; backward: dy, y, dx
	lda, ldb, l int
}

// smCheckRows checks a [..., C] float tensor of ref's shape and dtype
// (ref nil: any float tensor) and views it as rows.
func (e *Engine) smCheckRows(what string, t, ref *tensor.Tensor) (*tensor.Tensor, int, int, int, error) {
	if ref == nil {
		if err := e.checkView(what, t, false, floatTypes); err != nil {
			return nil, 0, 0, 0, err
		}
	} else if err := e.checkView(what, t, false, []tensor.DType{ref.DType}, ref.Shape...); err != nil {
		return nil, 0, 0, 0, err
	}
	return rwRows(what, t)
}

// Softmax computes y = exp(x − max x) / Σ exp(x − max x) over the last
// dimension of x (PyTorch's softmax(x, dim=-1); the maximum is subtracted
// for numerical stability). x and y: [..., C], one shape and one dtype (f32
// or bf16), computed in f32; rows may be strided (leading dimensions
// merging into one row stride, last dimension contiguous). A row of all
// −Inf gives NaN, as in PyTorch. Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) Softmax(y, x *tensor.Tensor) error {
	var a smArgs
	var err error
	if a.a, a.rows, a.cols, a.lda, err = e.smCheckRows("softmax x", x, nil); err != nil {
		return err
	}
	if a.out, _, _, a.l, err = e.smCheckRows("softmax y", y, x); err != nil {
		return err
	}
	if a.rows == 0 || a.cols == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostSoftmax(&a) },
		func(c *cudaImpl) error {
			p := rwPlanRows(a.cols, rwVecOK([]*tensor.Tensor{a.a, a.out}, a.cols, a.lda, a.l))
			return c.smFwd(x.DType, p, a.out, a.a, a.rows, a.cols, a.lda, a.l)
		})
}

// SoftmaxBackward computes dx = y ⊙ (dy − Σ y·dy) (the sum over the last
// dimension) from Softmax's output y and the gradient dy of y, or adds it
// to dx when acc. dx, dy and y: one shape and dtype, rows may be strided as
// in Softmax. Errors as Softmax.
func (e *Engine) SoftmaxBackward(dx, dy, y *tensor.Tensor, acc bool) error {
	var a smArgs
	var err error
	if a.b, a.rows, a.cols, a.ldb, err = e.smCheckRows("softmax backward y", y, nil); err != nil {
		return err
	}
	if a.a, _, _, a.lda, err = e.smCheckRows("softmax backward dy", dy, y); err != nil {
		return err
	}
	if a.out, _, _, a.l, err = e.smCheckRows("softmax backward dx", dx, y); err != nil {
		return err
	}
	if a.rows == 0 || a.cols == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error { return hostSoftmaxBackward(&a, acc) },
		func(c *cudaImpl) error {
			p := rwPlanRows(a.cols, rwVecOK([]*tensor.Tensor{a.a, a.b, a.out}, a.cols, a.lda, a.ldb, a.l))
			return c.smBwd(y.DType, p, a.out, a.a, a.b, a.rows, a.cols, a.l, a.lda, a.ldb, acc)
		})
}

// ---- host ----

func hostSoftmax(a *smArgs) error {
	xs, err := hostIn(a.a)
	if err != nil {
		return err
	}
	ys, commit, err := hostOut(a.out, false)
	if err != nil {
		return err
	}
	C := a.cols
	ex := make([]float64, C)
	for r := 0; r < a.rows; r++ {
		row := xs[r*C : (r+1)*C]
		m := math.Inf(-1)
		for _, v := range row {
			m = math.Max(m, float64(v))
		}
		var s float64
		for j, v := range row {
			ex[j] = math.Exp(float64(v) - m)
			s += ex[j]
		}
		for j := range row {
			ys[r*C+j] = float32(ex[j] / s)
		}
	}
	return commit()
}

func hostSoftmaxBackward(a *smArgs, acc bool) error {
	ins, err := hostIns(a.a, a.b)
	if err != nil {
		return err
	}
	gs, ys := ins[0], ins[1]
	dxs, commit, err := hostOut(a.out, acc)
	if err != nil {
		return err
	}
	C := a.cols
	for r := 0; r < a.rows; r++ {
		var s float64
		for j := r * C; j < (r+1)*C; j++ {
			s += float64(ys[j]) * float64(gs[j])
		}
		for j := r * C; j < (r+1)*C; j++ {
			dxs[j] = float32(float64(ys[j]) * (float64(gs[j]) - s))
		}
	}
	return commit()
}

// ---- CUDA ----

// smFwd launches sm_fwd_<inst>_<dt>.
func (c *cudaImpl) smFwd(dt tensor.DType, p rwPlan, y, x *tensor.Tensor, rows, cols, ldx, ldy int) error {
	return launch.SmFwd(c, p.inst+"_"+dtName(dt), p.fwdGrid(rows), block1(p.threads), 0,
		devPtr(y), devPtr(x), int64(rows), int32(cols), int64(ldx), int64(ldy), launch.Bool(p.block))
}

// smBwd launches sm_bwd_<inst>_<dt>.
func (c *cudaImpl) smBwd(dt tensor.DType, p rwPlan, dx, dy, y *tensor.Tensor, rows, cols, lddx, lddy, ldy int, acc bool) error {
	return launch.SmBwd(c, p.inst+"_"+dtName(dt), p.fwdGrid(rows), block1(p.threads), 0,
		devPtr(dx), devPtr(dy), devPtr(y), int64(rows), int32(cols), int64(lddx), int64(lddy), int64(ldy), launch.Bool(p.block), launch.Bool(acc))
}

// ---- graph ----

// Softmax records y = softmax(x) over x's last dimension (Engine.Softmax):
// y of x's shape and dtype. The backward reads y (kept by the tape), not x.
func (g *Graph) Softmax(x *Var) *Var {
	if !g.ok(x) {
		return nil
	}
	g.prefetch("softmax.cu")
	if err := rwFloat("softmax x", x); err != nil {
		g.Fail("softmax", err)
		return nil
	}
	if x.Value.Rank() < 1 {
		g.Fail("softmax", fmt.Errorf("%w: softmax of a scalar", tensor.ErrShape))
		return nil
	}
	y := g.NewOut("softmax", x.Value.DType, x.Value.Shape...)
	e := g.e
	g.Record("softmax", []*Var{x}, []*Var{y}, func(*Grads) error {
		return e.Softmax(y.Value, x.Value)
	}, func(gr *Grads) error {
		dy, dx := gr.Out(0), gr.In(0)
		if dy == nil || dx == nil {
			return nil
		}
		return e.SoftmaxBackward(dx, dy, y.Value, gr.Acc(0))
	})
	return y
}
