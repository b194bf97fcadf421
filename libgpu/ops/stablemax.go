package ops

// The stablemax family: stablemax cross-entropy (Prieto, Barsbey, Mediano
// & Birdal 2025, "Grokking at the Edge of Numerical Stability";
// sapientinc/HRM's models/losses.py stablemax_cross_entropy, the loss of
// its Sudoku runs) with an ignore label and HRM's per-sequence
// normalisation, loss and gradient (libgpu/kernels/stablemax.cu), and
// Graph.StablemaxCrossEntropy as a loss node. Reference and checks:
// opstest/stablemax.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// StablemaxS is stablemax's s(x): x + 1 for x ≥ 0, 1/(1 − x) for x < 0
// (HRM's s(x), whose 1e-30 in the denominator never matters: 1 − x ≥ 1).
func StablemaxS(x float64) float64 {
	if x >= 0 {
		return x + 1
	}
	return 1 / (1 - x)
}

// stablemaxDS is s'(x): 1 for x ≥ 0, 1/(1 − x)² for x < 0.
func stablemaxDS(x float64) float64 {
	if x >= 0 {
		return 1
	}
	return 1 / ((1 - x) * (1 - x))
}

// smxArgs is a validated call: logits and dlogits as [B, T, V].
type smxArgs struct {
	x, d          *tensor.Tensor
	b, t, v       int
	group, groups int
}

// StablemaxCrossEntropy computes the stablemax cross-entropy of logits
// against targets and, in the same pass, its gradient. With
// s(x) = x + 1 (x ≥ 0), 1/(1 − x) (x < 0) and p_j = s(x_j)/Σ_k s(x_k)
// per row,
//
//	ce_i    = −log p_{i,t_i}                         (0 for t_i < 0: ignored)
//	loss[0] = scale · Σ_g (1/max(n_g, 1)) · Σ_{i∈g} ce_i
//	dlogits = ∂loss/∂logits                          (0 on ignored rows)
//
// where the rows fall into consecutive groups of `group` rows (0: all
// rows one group) and n_g counts a group's rows with t_i ≥ 0. HRM's
// lm_loss, Σ over sequences of each sequence's mean over its labelled
// cells (loss_divisor = loss_counts.clamp_min(1)), is group = the
// sequence length and scale 1; group 0 gives the mean over valid rows
// (PyTorch's reduction="mean"), group 1 the sum. Any negative target is
// ignored (HRM's IGNORE_LABEL_ID = −100 among them).
//
// Every row is computed in float64 as HRM does (logits widened, s, the
// sums, the logs and the gradient in double, the gradient rounded to
// dlogits' dtype); the loss is summed in double in a fixed order, so it is
// bitwise reproducible.
//
// Shapes: logits [..., T, V] (rank ≥ 2; rank 1 is one row) f32 or bf16,
// the leading dimensions before T merging into one stride, T and V free
// (a [B, 81, V] slice of a [B, 82, V] output works), the last dimension
// contiguous; targets i32 contiguous with one element per row; group
// dividing the rows; loss f32 with one element, or nil; rowloss f32
// contiguous with one element per row receiving ce_i (f32), or nil;
// dlogits nil or of logits' shape, f32 or bf16 (its own dtype), strided
// like logits may be; accGrad adds the gradient into dlogits (ignored
// rows then keep their values). A target ≥ V: ErrLabel on the host; on
// CUDA that row's loss is NaN (so the loss is NaN). Other errors wrap
// tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or
// ErrConfig (a group that does not divide the rows).
func (e *Engine) StablemaxCrossEntropy(loss, rowloss, dlogits, logits, targets *tensor.Tensor, group int, scale float32, accGrad bool) error {
	a, err := e.checkSmx(loss, rowloss, dlogits, logits, targets, group, scale)
	if err != nil {
		return err
	}
	if a.b*a.t == 0 {
		if loss != nil {
			return e.Fill(loss, 0)
		}
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		return hostSmx(&a, loss, rowloss, targets, scale, accGrad)
	}, func(c *cudaImpl) error {
		return c.smx(&a, loss, rowloss, targets, scale, accGrad)
	})
}

func (e *Engine) checkSmx(loss, rowloss, dlogits, logits, targets *tensor.Tensor, group int, scale float32) (smxArgs, error) {
	const op = "stablemax cross-entropy"
	var a smxArgs
	if err := e.checkView(op+" logits", logits, false, floatTypes); err != nil {
		return a, err
	}
	if logits.Rank() < 1 || logits.Dim(-1) < 1 {
		return a, fmt.Errorf("%w: %s logits is %v, want [..., T, V ≥ 1]", tensor.ErrShape, op, logits.Shape)
	}
	view := func(what string, t *tensor.Tensor) (*tensor.Tensor, error) {
		v, tt := t.Dim(-1), 1
		if t.Rank() >= 2 {
			tt = t.Dim(-2)
		}
		b := 0
		if tt*v > 0 {
			b = t.Numel() / (tt * v)
		}
		x, err := t.View(b, tt, v)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %s %v strides %v: the dimensions before the last two do not merge (%v)", tensor.ErrLayout, op, what, t.Shape, t.Strides, err)
		}
		return x, nil
	}
	var err error
	if a.x, err = view("logits", logits); err != nil {
		return a, err
	}
	a.b, a.t, a.v = a.x.Dim(0), a.x.Dim(1), a.x.Dim(2)
	rows := a.b * a.t
	if dlogits != nil {
		if err := e.checkView(op+" dlogits", dlogits, false, floatTypes, logits.Shape...); err != nil {
			return a, err
		}
		if a.d, err = view("dlogits", dlogits); err != nil {
			return a, err
		}
	}
	if err := e.checkView(op+" targets", targets, true, []tensor.DType{tensor.I32}); err != nil {
		return a, err
	}
	if targets.Numel() != rows {
		return a, fmt.Errorf("%w: %s targets %v for %d rows of logits", tensor.ErrShape, op, targets.Shape, rows)
	}
	if loss != nil {
		if err := e.checkView(op+" loss", loss, true, []tensor.DType{tensor.F32}); err != nil {
			return a, err
		}
		if loss.Numel() != 1 {
			return a, fmt.Errorf("%w: %s loss is %v, want one element", tensor.ErrShape, op, loss.Shape)
		}
	}
	if rowloss != nil {
		if err := e.checkView(op+" rowloss", rowloss, true, []tensor.DType{tensor.F32}); err != nil {
			return a, err
		}
		if rowloss.Numel() != rows {
			return a, fmt.Errorf("%w: %s rowloss is %v, want %d elements", tensor.ErrShape, op, rowloss.Shape, rows)
		}
	}
	a.group = group
	if group == 0 {
		a.group = max(rows, 1)
	}
	if a.group < 0 || rows%a.group != 0 {
		return a, fmt.Errorf("%w: %s group of %d rows for %d rows", ErrConfig, op, group, rows)
	}
	a.groups = rows / a.group
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return a, fmt.Errorf("%w: %s scale %v", ErrConfig, op, scale)
	}
	lds := []int{a.v, rows, a.x.Strides[0], a.x.Strides[1]}
	if a.d != nil {
		lds = append(lds, a.d.Strides[0], a.d.Strides[1])
	}
	return a, checkDims(lds...)
}

func hostSmx(a *smxArgs, loss, rowloss, targets *tensor.Tensor, scale float32, acc bool) error {
	tg, err := targets.I32()
	if err != nil {
		return fmt.Errorf("ops: host backend: %w", err)
	}
	for i, t := range tg {
		if int(t) >= a.v {
			return fmt.Errorf("%w: stablemax cross-entropy target %d at row %d, %d classes", ErrLabel, t, i, a.v)
		}
	}
	xs, err := hostIn(a.x)
	if err != nil {
		return err
	}
	g, commit, err := hostOut(a.d, acc)
	if err != nil {
		return err
	}
	counts := make([]int, a.groups)
	for i, t := range tg {
		if t >= 0 {
			counts[i/a.group]++
		}
	}
	V := a.v
	rows := make([]float32, len(tg))
	var sum float64
	for i, t := range tg {
		row := xs[i*V : (i+1)*V]
		if t < 0 {
			// Zero (hostOut's fresh buffer with acc, to which the commit
			// adds the old values; the tensor's own memory without).
			if g != nil && !acc {
				clear(g[i*V : (i+1)*V])
			}
			continue
		}
		var S float64
		for _, x := range row {
			S += StablemaxS(float64(x))
		}
		xt := float64(row[t])
		ce := math.Log(S) - math.Log(StablemaxS(xt))
		rows[i] = float32(ce)
		w := float64(scale) / float64(max(counts[i/a.group], 1))
		sum += ce / float64(max(counts[i/a.group], 1))
		if g == nil {
			continue
		}
		dt := stablemaxDS(xt) / StablemaxS(xt)
		for j, x := range row {
			d := stablemaxDS(float64(x)) / S
			if j == int(t) {
				d -= dt
			}
			g[i*V+j] = float32(w * d)
		}
	}
	if err := commit(); err != nil {
		return err
	}
	if rowloss != nil {
		if err := rowloss.WriteFloat32(rows); err != nil {
			return err
		}
	}
	if loss != nil {
		return loss.WriteFloat32([]float32{float32(float64(scale) * sum)})
	}
	return nil
}

func (c *cudaImpl) smx(a *smxArgs, loss, rowloss, targets *tensor.Tensor, scale float32, acc bool) error {
	rows := a.b * a.t
	rl, err := c.Scratch("stablemax.rowloss", int64(rows)*8)
	if err != nil {
		return err
	}
	counts, err := c.Scratch("stablemax.counts", int64(a.groups)*4)
	if err != nil {
		return err
	}
	k := launch.SmxArgs{Loss: devPtr(loss), Rl: rl, Rowloss: devPtr(rowloss), Dl: devPtr(a.d), X: devPtr(a.x),
		Targets: devPtr(targets), Counts: counts, B: int64(a.b), T: int64(a.t),
		Xs0: int64(a.x.Strides[0]), Xs1: int64(a.x.Strides[1]), Group: int64(a.group),
		V: int32(a.v), Ngroups: int32(a.groups), Scale: scale, Acc: lnBool(acc)}
	gdt := a.x.DType
	if a.d != nil {
		k.Ds0, k.Ds1, gdt = int64(a.d.Strides[0]), int64(a.d.Strides[1]), a.d.DType
	}
	if err := launch.SmxCount(c, grid1(min(a.groups, 65535)), block1(256), 0, &k); err != nil {
		return err
	}
	if err := launch.SmxRows(c, dtName(a.x.DType)+dtSuffix(gdt), grid1(min((rows+7)/8, 65535)), block1(256), 0, &k); err != nil {
		return err
	}
	if loss == nil {
		return nil
	}
	return launch.SmxReduce(c, grid1(1), block1(1024), 0, &k)
}

// StablemaxCrossEntropy records the stablemax cross-entropy of logits
// [..., T, V] against targets (an Input of i32, one per row, negative =
// ignored) as a loss node ([1] f32): HRM's lm_loss is
// StablemaxCrossEntropy(logits, labels, seqLen, 1), each sequence's mean
// over its labelled cells summed over the batch (Engine
// StablemaxCrossEntropy for group and scale). Its forward computes the
// loss and the logits' gradient in one pass; it must be a root of the
// backward (nothing may consume the loss). Several loss nodes add their
// gradients (the lm loss and the Q losses of HRM).
func (g *Graph) StablemaxCrossEntropy(logits, targets *Var, group int, scale float32) *Var {
	if !g.ok(logits, targets) {
		return nil
	}
	if _, err := g.e.checkSmx(nil, nil, nil, logits.Value, targets.Value, group, scale); err != nil {
		g.Fail("stablemax_cross_entropy", err)
		return nil
	}
	loss := g.NewOut("stablemax_cross_entropy", tensor.F32, 1)
	e := g.e
	g.RecordLoss("stablemax_cross_entropy", []*Var{logits, targets}, loss, func(gr *Grads) error {
		return e.StablemaxCrossEntropy(loss.Value, nil, gr.In(0), logits.Value, targets.Value, group, scale, gr.Acc(0))
	})
	return loss
}
