package ops

// The mse family: the mean squared error loss with its gradient in the same
// pass (a diffusion model's ε-prediction objective, Ho et al. 2020's
// L_simple) — libgpu/kernels/mse.cu — and Graph.MSELoss. Reference and
// checks: opstest/mse.go.

import (
	"fmt"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// mseBlocks caps the blocks (and so the partial sums) of mse_partial.
const mseBlocks = 1024

// MSELoss computes loss[0] = Σ (pred − target)²/n over the n elements of
// pred and target (PyTorch's F.mse_loss with reduction="mean") and, when
// dpred is not nil, dpred = 2·(pred − target)/n, its gradient (added to
// dpred when acc). pred, target and dpred contiguous, of one shape and
// dtype (f32 or bf16); loss f32 [1]. The sum is in f32 in a fixed order
// (per-block partial sums, then their sum): the same bits on every run.
// Errors wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or
// exec.ErrDevice.
func (e *Engine) MSELoss(loss, dpred, pred, target *tensor.Tensor, acc bool) error {
	names := []string{"pred", "target"}
	ts := []*tensor.Tensor{target}
	if dpred != nil {
		names, ts = append(names, "dpred"), append(ts, dpred)
	}
	if err := e.rwCheckElem("mse", true, pred, names, ts...); err != nil {
		return err
	}
	if err := e.checkView("mse loss", loss, true, []tensor.DType{tensor.F32}, 1); err != nil {
		return err
	}
	n := pred.Numel()
	if n == 0 {
		return fmt.Errorf("%w: mse of no elements", tensor.ErrShape)
	}
	inv := float32(1 / float64(n))
	return e.dispatch(func(*hostImpl) error {
		ins, err := hostIns(pred, target)
		if err != nil {
			return err
		}
		ps, ys := ins[0], ins[1]
		ds, commit, err := hostOut(dpred, acc)
		if err != nil {
			return err
		}
		var s float64
		for i, p := range ps {
			d := p - ys[i]
			s += float64(d) * float64(d)
			if ds != nil {
				ds[i] = 2 * d * inv
			}
		}
		if err := commit(); err != nil {
			return err
		}
		return loss.WriteFloat32([]float32{float32(s / float64(n))})
	}, func(c *cudaImpl) error {
		blocks := min((n+1023)/1024, mseBlocks)
		part, err := c.Scratch("mse.partials", int64(blocks)*4)
		if err != nil {
			return err
		}
		if err := launch.MsePartial(c, dtName(pred.DType), grid1(blocks), block1(256), 0,
			part, devPtr(dpred), devPtr(pred), devPtr(target), int64(n), inv, launch.Bool(acc)); err != nil {
			return err
		}
		return launch.MseFinal(c, grid1(1), block1(256), 0, devPtr(loss), part, int32(blocks), inv)
	})
}

// MSELoss records the loss mean((pred − target)²) (Engine.MSELoss), a
// scalar f32 [1] Var, whose forward also writes pred's gradient: the root
// of the backward pass. target is an input without a gradient, of pred's
// shape (cast to pred's dtype).
func (g *Graph) MSELoss(pred, target *Var) *Var {
	if !g.ok(pred, target) {
		return nil
	}
	g.prefetch("mse.cu")
	if err := rwFloat("mse pred", pred); err != nil {
		g.Fail("mse", err)
		return nil
	}
	if !tensor.SameShape(pred.Value.Shape, target.Value.Shape) {
		g.Fail("mse", fmt.Errorf("%w: mse of %v against %v", tensor.ErrShape, pred.Value.Shape, target.Value.Shape))
		return nil
	}
	target = g.Cast(target, pred.Value.DType)
	loss := g.NewOut("mse", tensor.F32, 1)
	e := g.e
	g.RecordLoss("mse", []*Var{pred, target}, loss, func(gr *Grads) error {
		return e.MSELoss(loss.Value, gr.In(0), pred.Value, target.Value, gr.Acc(0))
	})
	return loss
}
