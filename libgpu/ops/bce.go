package ops

// The bce family: binary cross-entropy with logits, summed and scaled
// (PyTorch's F.binary_cross_entropy_with_logits(x, y, reduction="sum"),
// the Q-halt and Q-continue losses of sapientinc/HRM's models/losses.py
// ACTLossHead, weighted 0.5 there), loss and gradient in one kernel
// (libgpu/kernels/bce.cu), and Graph.BCEWithLogits as a loss node.
// Reference and checks: opstest/bce.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// BCEWithLogits computes, over every element of x and its target y,
//
//	loss[0] = scale · Σ_i max(x_i, 0) − x_i·y_i + log(1 + e^(−|x_i|))
//	dx_i    = scale · (σ(x_i) − y_i)
//
// (the numerically stable form of −y·log σ(x) − (1 − y)·log(1 − σ(x))),
// in double with the sum in a fixed order. HRM's q_halt_loss +
// q_continue_loss, weighted 0.5, is one call over its [B, 2] Q logits
// with the two targets side by side and scale 0.5. x: f32 or bf16,
// contiguous, any shape; y: f32 or bf16, contiguous, x's shape (targets
// in [0, 1]; no gradient); loss f32 with one element, or nil; dx nil or
// of x's shape and dtype (may be x), added to with acc. One block on CUDA:
// meant for a few thousand elements. Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or ErrConfig (scale not
// finite).
func (e *Engine) BCEWithLogits(loss, dx, x, y *tensor.Tensor, scale float32, acc bool) error {
	if err := e.checkBCE(loss, dx, x, y, scale); err != nil {
		return err
	}
	n := x.Numel()
	return e.dispatch(func(*hostImpl) error {
		ins, err := hostIns(x, y)
		if err != nil {
			return err
		}
		d, commit, err := hostOut(dx, acc)
		if err != nil {
			return err
		}
		var s float64
		for i := 0; i < n; i++ {
			xi, yi := float64(ins[0][i]), float64(ins[1][i])
			s += math.Max(xi, 0) - xi*yi + math.Log1p(math.Exp(-math.Abs(xi)))
			if d != nil {
				d[i] = float32(float64(scale) * (sigmoid64(xi) - yi))
			}
		}
		if err := commit(); err != nil {
			return err
		}
		if loss == nil {
			return nil
		}
		return loss.WriteFloat32([]float32{float32(float64(scale) * s)})
	}, func(c *cudaImpl) error {
		k := launch.BceArgs{Loss: devPtr(loss), Dx: devPtr(dx), X: devPtr(x), Y: devPtr(y), N: int64(n), Scale: scale, Acc: lnBool(acc)}
		return launch.Bce(c, dtName(x.DType)+dtSuffix(y.DType), grid1(1), block1(1024), 0, &k)

	})
}

func (e *Engine) checkBCE(loss, dx, x, y *tensor.Tensor, scale float32) error {
	const op = "bce"
	if err := e.checkView(op+" x", x, true, floatTypes); err != nil {
		return err
	}
	if err := e.checkView(op+" target", y, true, floatTypes, x.Shape...); err != nil {
		return err
	}
	if dx != nil {
		if err := e.checkView(op+" dx", dx, true, []tensor.DType{x.DType}, x.Shape...); err != nil {
			return err
		}
	}
	if loss != nil {
		if err := e.checkView(op+" loss", loss, true, []tensor.DType{tensor.F32}); err != nil {
			return err
		}
		if loss.Numel() != 1 {
			return fmt.Errorf("%w: %s loss is %v, want one element", tensor.ErrShape, op, loss.Shape)
		}
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return fmt.Errorf("%w: %s scale %v", ErrConfig, op, scale)
	}
	return nil
}

// BCEWithLogits records scale·Σ BCE-with-logits(x, target) as a loss node
// ([1] f32; Engine.BCEWithLogits): x contiguous f32 or bf16, target an
// Input of x's shape (no gradient). HRM's 0.5·(q_halt_loss +
// q_continue_loss) is BCEWithLogits(q, targets, 0.5) with q [B, 2] and the
// targets [B, 2]. It must be a root of the backward; several loss nodes
// add their gradients.
func (g *Graph) BCEWithLogits(x, target *Var, scale float32) *Var {
	if !g.ok(x, target) {
		return nil
	}
	if err := g.e.checkBCE(nil, nil, x.Value, target.Value, scale); err != nil {
		g.Fail("bce_with_logits", err)
		return nil
	}
	loss := g.NewOut("bce_with_logits", tensor.F32, 1)
	e := g.e
	g.RecordLoss("bce_with_logits", []*Var{x, target}, loss, func(gr *Grads) error {
		return e.BCEWithLogits(loss.Value, gr.In(0), x.Value, target.Value, scale, gr.Acc(0))
	})
	return loss
}
