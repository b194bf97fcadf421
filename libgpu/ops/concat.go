package ops

// The concat family: concatenation along the last (channel) dimension of
// channels-last tensors — a U-Net's skip connections — and its backward,
// the split (libgpu/kernels/concat.cu), and Graph.Concat. Reference and
// checks: opstest/concat.go.

import (
	"fmt"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

func (e *Engine) catCheck(op string, y, a, b *tensor.Tensor) (rows, ca, cb int, err error) {
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
	}{{"y", y}, {"a", a}, {"b", b}} {
		if c.t == nil {
			continue
		}
		if err := e.checkView(op+" "+c.what, c.t, true, floatTypes); err != nil {
			return 0, 0, 0, err
		}
		if c.t.DType != y.DType {
			return 0, 0, 0, fmt.Errorf("%w: %s %s is %v, y %v", tensor.ErrDType, op, c.what, c.t.DType, y.DType)
		}
	}
	if y.Rank() < 1 || (a != nil && a.Rank() != y.Rank()) || (b != nil && b.Rank() != y.Rank()) {
		return 0, 0, 0, fmt.Errorf("%w: %s of ranks differing or 0", tensor.ErrShape, op)
	}
	r := y.Rank()
	lead := y.Shape[:r-1]
	ct := y.Dim(-1)
	if a != nil {
		ca = a.Dim(-1)
	}
	if b != nil {
		cb = b.Dim(-1)
	}
	if a == nil {
		ca = ct - cb
	}
	if b == nil {
		cb = ct - ca
	}
	for _, t := range []*tensor.Tensor{a, b} {
		if t != nil && !tensor.SameShape(t.Shape[:r-1], lead) {
			return 0, 0, 0, fmt.Errorf("%w: %s of %v into %v", tensor.ErrShape, op, t.Shape, y.Shape)
		}
	}
	if ca < 0 || cb < 0 || ca+cb != ct {
		return 0, 0, 0, fmt.Errorf("%w: %s of %d and %d channels into %d", tensor.ErrShape, op, ca, cb, ct)
	}
	return tensor.Numel(lead), ca, cb, nil
}

// ConcatChannels computes y[..., :Ca] = a, y[..., Ca:] = b (PyTorch's
// torch.cat([a, b], dim=-1)): a [..., Ca], b [..., Cb], y [..., Ca+Cb] with
// the same leading dimensions, contiguous, one dtype (f32 or bf16). Errors
// wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) ConcatChannels(y, a, b *tensor.Tensor) error {
	if a == nil || b == nil || y == nil {
		return fmt.Errorf("%w: concat needs y, a and b", tensor.ErrShape)
	}
	rows, ca, cb, err := e.catCheck("concat", y, a, b)
	if err != nil {
		return err
	}
	return e.concat(y, a, b, rows, ca, cb, false, false, false)
}

// SplitChannels is ConcatChannels' backward: da (+)= dy[..., :Ca] and db
// (+)= dy[..., Ca:] (adding when acca, accb). Either of da, db may be nil.
// Errors as ConcatChannels.
func (e *Engine) SplitChannels(da, db, dy *tensor.Tensor, acca, accb bool) error {
	if dy == nil || (da == nil && db == nil) {
		return fmt.Errorf("%w: split needs dy and da or db", tensor.ErrShape)
	}
	rows, ca, cb, err := e.catCheck("split", dy, da, db)
	if err != nil {
		return err
	}
	return e.concat(dy, da, db, rows, ca, cb, true, acca, accb)
}

func (e *Engine) concat(y, a, b *tensor.Tensor, rows, ca, cb int, split, acca, accb bool) error {
	ct := ca + cb
	if rows == 0 || ct == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		if !split {
			ins, err := hostIns(a, b)
			if err != nil {
				return err
			}
			as, bs := ins[0], ins[1]
			ys, commit, err := hostOut(y, false)
			if err != nil {
				return err
			}
			for r := 0; r < rows; r++ {
				copy(ys[r*ct:], as[r*ca:(r+1)*ca])
				copy(ys[r*ct+ca:], bs[r*cb:(r+1)*cb])
			}
			return commit()
		}
		gs, err := hostIn(y)
		if err != nil {
			return err
		}
		for _, p := range []struct {
			t        *tensor.Tensor
			off, cnt int
			acc      bool
		}{{a, 0, ca, acca}, {b, ca, cb, accb}} {
			if p.t == nil {
				continue
			}
			out, commit, err := hostOut(p.t, p.acc)
			if err != nil {
				return err
			}
			for r := 0; r < rows; r++ {
				copy(out[r*p.cnt:(r+1)*p.cnt], gs[r*ct+p.off:r*ct+p.off+p.cnt])
			}
			if err := commit(); err != nil {
				return err
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		n := int64(rows) * int64(ct)
		if !split {
			return launch.CatFwd(c, dtName(y.DType), gridFor(n, 256), block1(256), 0,
				devPtr(y), devPtr(a), devPtr(b), int64(rows), int32(ca), int32(cb))
		}
		return launch.CatBwd(c, dtName(y.DType), gridFor(n, 256), block1(256), 0,
			devPtr(a), devPtr(b), devPtr(y), int64(rows), int32(ca), int32(cb), launch.Bool(acca), launch.Bool(accb))

	})
}

// Concat records y = torch.cat([a, b], dim=-1) (Engine.ConcatChannels): a
// [..., Ca] and b [..., Cb] with the same leading dimensions, y of a's
// dtype (b is cast to it). The backward splits dy into both gradients.
func (g *Graph) Concat(a, b *Var) *Var {
	if !g.ok(a, b) {
		return nil
	}
	g.prefetch("concat.cu")
	if err := rwFloat("concat a", a); err != nil {
		g.Fail("concat", err)
		return nil
	}
	as, bs := a.Value.Shape, b.Value.Shape
	r := len(as)
	if r < 1 || len(bs) != r || !tensor.SameShape(as[:r-1], bs[:r-1]) {
		g.Fail("concat", fmt.Errorf("%w: concat of %v and %v", tensor.ErrShape, as, bs))
		return nil
	}
	b = g.Cast(b, a.Value.DType)
	shape := append(append([]int(nil), as[:r-1]...), as[r-1]+bs[r-1])
	y := g.NewOut("concat", a.Value.DType, shape...)
	if !g.ok(y) {
		return nil
	}
	e := g.e
	g.Record("concat", []*Var{a, b}, []*Var{y}, func(*Grads) error {
		return e.ConcatChannels(y.Value, a.Value, b.Value)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil || (gr.In(0) == nil && gr.In(1) == nil) {
			return nil
		}
		return e.SplitChannels(gr.In(0), gr.In(1), dy, gr.Acc(0), gr.Acc(1))
	})
	return y
}
