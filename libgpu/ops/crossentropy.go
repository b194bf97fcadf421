package ops

// The cross-entropy family: softmax cross-entropy over rows of logits
// (sequences × large vocabularies), forward and backward fused in one
// kernel (libgpu/kernels/crossentropy.cu), with PyTorch's ignore_index.
// Graph.CrossEntropy records it as the tape's loss node. Reference and
// checks: opstest/crossentropy.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// CrossEntropy computes PyTorch's F.cross_entropy(logits, targets,
// ignore_index=-1, reduction="mean") and, in the same pass, its gradient:
//
//	loss[0]      = (1/n) Σ_{i: t_i ≥ 0} (log Σ_j exp(x_ij) − x_{i,t_i})
//	dlogits[i,j] = (softmax(x_i)_j − [j = t_i]) / n          (t_i ≥ 0)
//	dlogits[i,j] = 0                                          (t_i < 0)
//
// with n the number of rows whose target is ≥ 0 (any negative target is
// ignored, as ignore_index=-1 is in nanoGPT); with no such row the loss
// is 0 and the gradient 0. accGrad adds the gradient to dlogits instead
// of writing it (ignored rows then keep their values). The log-sum-exp is
// numerically stable (the row maximum is subtracted; computed in f32 on
// CUDA with an online max/sum, in float64 on the host), and the mean is
// summed in a fixed order: the loss is bitwise reproducible.
//
// Shapes: logits [..., V] f32 or bf16, its leading dimensions mergeable
// into N rows (tensor.View; row strides are free), its last contiguous;
// targets i32 contiguous with N elements (any shape); loss f32 with one
// element; dlogits nil (the loss only: evaluation) or of logits' shape,
// f32 or bf16 (its own dtype), rows strided like logits may be, or
// logits itself (the gradient written in place over the logits).
//
// A target ≥ V: ErrLabel on the host; on CUDA (which cannot report it)
// that row's loss is NaN, so the mean is NaN. Other errors wrap
// tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) CrossEntropy(loss, dlogits, logits, targets *tensor.Tensor, accGrad bool) error {
	x, d, err := e.checkXent("cross-entropy", logits, dlogits, targets)
	if err != nil {
		return err
	}
	if err := e.checkView("cross-entropy loss", loss, true, []tensor.DType{tensor.F32}); err != nil {
		return err
	}
	if loss.Numel() != 1 {
		return fmt.Errorf("%w: cross-entropy loss is %v, want one element", tensor.ErrShape, loss.Shape)
	}
	n, v := x.Dim(0), x.Dim(1)
	if n == 0 {
		return e.Fill(loss, 0)
	}
	return e.dispatch(func(*hostImpl) error {
		rows, valid, err := hostXent(x, d, targets, accGrad)
		if err != nil {
			return err
		}
		var sum float64
		for _, l := range rows {
			sum += l // 0 for ignored rows
		}
		mean := float32(0)
		if valid > 0 {
			mean = float32(sum / float64(valid))
		}
		return loss.WriteFloat32([]float32{mean})
	}, func(c *cudaImpl) error {
		rowloss, err := c.Scratch("crossentropy.rowloss", int64(n)*4)
		if err != nil {
			return err
		}
		state, err := c.Scratch("crossentropy.state", 8)
		if err != nil {
			return err
		}
		if err := launch.XentCount(c, grid1(1), block1(1024), 0, state, devPtr(targets), int32(n)); err != nil {
			return err
		}
		return c.xent(devPtr(loss), rowloss, d, x, targets, state, n, v, accGrad)
	})
}

// CrossEntropyRows writes each row's loss, rowloss[i] = log Σ_j exp(x_ij)
// − x_{i,t_i} (0 for an ignored row, t_i < 0): CrossEntropy without the
// mean and the gradient, for evaluation (perplexity, per-token losses).
// rowloss is f32 contiguous with N elements; the rest and the errors as
// CrossEntropy (a target ≥ V gives NaN on CUDA).
func (e *Engine) CrossEntropyRows(rowloss, logits, targets *tensor.Tensor) error {
	x, _, err := e.checkXent("cross-entropy rows", logits, nil, targets)
	if err != nil {
		return err
	}
	if err := e.checkView("cross-entropy rowloss", rowloss, true, []tensor.DType{tensor.F32}); err != nil {
		return err
	}
	n, v := x.Dim(0), x.Dim(1)
	if rowloss.Numel() != n {
		return fmt.Errorf("%w: cross-entropy rowloss is %v, want %d elements", tensor.ErrShape, rowloss.Shape, n)
	}
	if n == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		rows, _, err := hostXent(x, nil, targets, false)
		if err != nil {
			return err
		}
		out := make([]float32, n)
		for i, l := range rows {
			out[i] = float32(l)
		}
		return rowloss.WriteFloat32(out)
	}, func(c *cudaImpl) error {
		return c.xent(0, devPtr(rowloss), nil, x, targets, 0, n, v, false)
	})
}

// checkXent validates logits, dlogits (may be nil) and targets and returns
// logits and dlogits viewed as [N, V].
func (e *Engine) checkXent(op string, logits, dlogits, targets *tensor.Tensor) (x, d *tensor.Tensor, err error) {
	if err := e.checkView(op+" logits", logits, false, floatTypes); err != nil {
		return nil, nil, err
	}
	if logits.Rank() < 1 || logits.Dim(-1) < 1 {
		return nil, nil, fmt.Errorf("%w: %s logits is %v, want [..., V ≥ 1]", tensor.ErrShape, op, logits.Shape)
	}
	v := logits.Dim(-1)
	rows := logits.Numel() / v
	if x, err = logits.View(rows, v); err != nil {
		return nil, nil, fmt.Errorf("%s logits: leading dimensions not mergeable: %w", op, err)
	}
	if err := e.checkView(op+" targets", targets, true, []tensor.DType{tensor.I32}); err != nil {
		return nil, nil, err
	}
	if targets.Numel() != x.Dim(0) {
		return nil, nil, fmt.Errorf("%w: %s targets %v for %d rows of logits", tensor.ErrShape, op, targets.Shape, x.Dim(0))
	}
	if dlogits != nil {
		if err := e.checkView(op+" dlogits", dlogits, false, floatTypes, logits.Shape...); err != nil {
			return nil, nil, err
		}
		if d, err = dlogits.View(rows, v); err != nil {
			return nil, nil, fmt.Errorf("%s dlogits: leading dimensions not mergeable: %w", op, err)
		}
	}
	lds := []int{x.Dim(0), v, ldOf(x)}
	if d != nil {
		lds = append(lds, ldOf(d))
	}
	return x, d, checkDims(lds...)
}

// hostXent returns each row's loss in float64 (0 for ignored rows) and
// the number of rows not ignored and, when d is not nil, writes (or adds,
// with acc) the gradient of the mean.
func hostXent(x, d, targets *tensor.Tensor, acc bool) ([]float64, int, error) {
	tg, err := targets.I32()
	if err != nil {
		return nil, 0, fmt.Errorf("ops: host backend: %w", err)
	}
	n, v := x.Dim(0), x.Dim(1)
	valid := 0
	for i, t := range tg {
		if int(t) >= v {
			return nil, 0, fmt.Errorf("%w: cross-entropy target %d at row %d, vocabulary %d", ErrLabel, t, i, v)
		}
		if t >= 0 {
			valid++
		}
	}
	xs, err := hostIn(x)
	if err != nil {
		return nil, 0, err
	}
	g, commit, err := hostOut(d, acc)
	if err != nil {
		return nil, 0, err
	}
	rows := make([]float64, n)
	for i := 0; i < n; i++ {
		t := int(tg[i])
		row := xs[i*v : (i+1)*v]
		if t < 0 {
			if g != nil {
				clear(g[i*v : (i+1)*v])
			}
			continue
		}
		mx := math.Inf(-1)
		for _, a := range row {
			mx = math.Max(mx, float64(a))
		}
		var s float64
		for _, a := range row {
			s += math.Exp(float64(a) - mx)
		}
		rows[i] = mx + math.Log(s) - float64(row[t])
		if g == nil {
			continue
		}
		inv := 1 / float64(valid)
		gr := g[i*v : (i+1)*v]
		for j, a := range row {
			p := math.Exp(float64(a)-mx) / s
			if j == t {
				p--
			}
			gr[j] = float32(p * inv)
		}
	}
	return rows, valid, commit()
}

// xent launches xent_warp (one warp per row, V ≤ 1024) or xent_rows (one
// block per row, 16-byte vectors) of crossentropy.cu for logits x [n, v]
// and dlogits d (nil: none). loss and state are zero for per-row losses
// only (rowloss then is the caller's output).
func (c *cudaImpl) xent(loss, rowloss cuda.DevicePtr, d, x, targets *tensor.Tensor, state cuda.DevicePtr, n, v int, acc bool) error {
	gdt, dl, ldg := x.DType, cuda.DevicePtr(0), int64(0)
	if d != nil {
		gdt, dl, ldg = d.DType, devPtr(d), int64(ldOf(d))
	}
	inst := dtName(x.DType) + dtSuffix(gdt)
	kernel, grid, block := launch.XentWarp, grid1((n+7)/8), block1(256)
	if v > 1024 {
		// Threads: about four 16-byte vectors each, 64 to 1024. Large rows get
		// large blocks: fewer rows in flight per SM (GPT-2's bf16 row is
		// 100 KB), so the gradient pass's second read of a row finds it in L2.
		nvec := v * x.DType.Size() / 16
		bs := min(max((nvec/4+31)/32*32, 64), 1024)
		kernel, grid, block = launch.XentRows, grid1(n), block1(bs)
	}
	return kernel(c, inst, grid, block, 0, loss, rowloss, dl, ldg, devPtr(x), int64(ldOf(x)), devPtr(targets),
		int32(n), int32(v), state, launch.Bool(acc))
}

// ---- graph ----

// CrossEntropy records the mean softmax cross-entropy of logits [..., V]
// against targets (an Input of i32, one per row, negative = ignored) as a
// loss node: its forward computes the loss ([1] f32) and, in the same
// kernel, the logits' gradient (Engine.CrossEntropy). It must be the root
// of the backward pass (nothing may consume the loss).
func (g *Graph) CrossEntropy(logits, targets *Var) *Var {
	if !g.ok(logits, targets) {
		return nil
	}
	g.prefetch("crossentropy.cu")
	if targets.Value.DType != tensor.I32 {
		g.Fail("cross_entropy", fmt.Errorf("%w: targets are %v, want i32", tensor.ErrDType, targets.Value.DType))
		return nil
	}
	loss := g.NewOut("cross_entropy", tensor.F32, 1)
	e := g.e
	g.RecordLoss("cross_entropy", []*Var{logits, targets}, loss, func(gr *Grads) error {
		return e.CrossEntropy(loss.Value, gr.In(0), logits.Value, targets.Value, gr.Acc(0))
	})
	return loss
}
