package ops

import (
	"fmt"
	"math"
	"os"

	"gpukit/libgpu/device"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// ConvFused is what Conv2DFused adds around a convolution: an input map
// and output terms.
type ConvFused struct {
	// Groups > 0 group-normalises the input first (GroupNorm with NormW,
	// NormB: f32 [Cin] or nil, Groups dividing Cin, Eps) and, with SiLU,
	// passes it through SiLU; the convolution pads the mapped input with
	// zeros, as it would a separate GroupNorm's output.
	Groups       int
	NormW, NormB *tensor.Tensor
	Eps          float32
	SiLU         bool
	// NBias [N, Cout] (x's dtype, or nil) is added to sample n's outputs: a
	// per-sample bias (a U-Net's time-embedding projection).
	NBias *tensor.Tensor
	// Res (y's shape and dtype, or nil) is added to the output: a residual.
	Res *tensor.Tensor
}

// Conv2DFused computes
//
//	y = Conv2D(m(x), w, b) + NBias[n] + Res,  m = SiLU∘GroupNorm (as f.Groups, f.SiLU) or the identity
//
// for Conv2D's tensors and parameters (f's as ConvFused says; f.Groups are
// the GroupNorm's groups, p.Groups the convolution's). The result is that
// of GroupNorm, Conv2D, AddChannels and Add run one after another, but for
// rounding: on CUDA in bf16, where the implicit GEMM takes the shape (no
// dilation, one group, Cin a multiple of 32, Cout even, 16-byte aligned
// tensors; convFuseKernels), one pass computes
// the normalisation's per-sample scale and shift (gn_affine) and the
// convolution applies them (and SiLU) to its input tiles as they arrive
// and adds the terms in its epilogue (conv_igemm_args), so the normalised
// input, the convolution's output before the additions and the sums are
// never stored; the mapped input is rounded to bf16 as GroupNorm would
// store it, the additions are made in f32 and rounded once. Elsewhere
// (a dilated or grouped convolution among them) the separate ops run on
// scratch memory. Forward only (no backward:
// Graph.ConvBlock records the separate ops in a training graph). Errors as
// Conv2D and GroupNorm.
func (e *Engine) Conv2DFused(y, x, w, b *tensor.Tensor, p Conv2DParams, f ConvFused) error {
	s, err := e.convGeometry("conv2d fused", x, w, p)
	if err != nil {
		return err
	}
	dts := []tensor.DType{x.DType}
	if err := e.checkView("conv2d fused y", y, true, dts, s.n, s.ho, s.wo, s.cout); err != nil {
		return err
	}
	if b != nil {
		if err := e.checkView("conv2d fused b", b, true, dts, s.cout); err != nil {
			return err
		}
	}
	if f.NBias != nil {
		if err := e.checkView("conv2d fused nbias", f.NBias, true, dts, s.n, s.cout); err != nil {
			return err
		}
	}
	if f.Res != nil {
		if err := e.checkView("conv2d fused res", f.Res, true, dts, s.n, s.ho, s.wo, s.cout); err != nil {
			return err
		}
	}
	if f.Groups > 0 {
		if !(f.Eps >= 0) || math.IsInf(float64(f.Eps), 1) {
			return fmt.Errorf("%w: conv2d fused groupnorm eps %v", ErrConfig, f.Eps)
		}
		if _, err := e.gnCheck("conv2d fused groupnorm", x, f.Groups, f.NormW, f.NormB, nil, nil); err != nil {
			return err
		}
	}
	if s.n == 0 {
		return nil
	}
	if c := e.c; c != nil && c.convFusedOK(x, w, y, b, f, &s) {
		return c.conv2dFused(x, w, b, y, f, &s)
	}
	return e.conv2dComposed(y, x, w, b, p, f)
}

// conv2dComposed is Conv2DFused as the separate ops, the normalised input
// in memory of the engine's device (scratch on CUDA).
func (e *Engine) conv2dComposed(y, x, w, b *tensor.Tensor, p Conv2DParams, f ConvFused) error {
	in := x
	if f.Groups > 0 {
		var act *tensor.Tensor
		var err error
		if e.c != nil {
			act, err = e.c.scratchTensor(e, "conv2d.fused_act", x.DType, x.Shape...)
		} else {
			act, err = tensor.Alloc(device.Local{Dev: e.Device()}, "", x.DType, x.Shape...)
			if err == nil {
				defer act.Buf.Free()
			}
		}
		if err != nil {
			return err
		}
		if err := e.GroupNorm(act, nil, nil, x, f.NormW, f.NormB, f.Groups, f.Eps, f.SiLU); err != nil {
			return err
		}
		in = act
	}
	if err := e.Conv2D(y, in, w, b, p); err != nil {
		return err
	}
	if f.NBias != nil {
		if err := e.AddChannels(y, y, f.NBias); err != nil {
			return err
		}
	}
	if f.Res != nil {
		return e.Add(y, y, f.Res)
	}
	return nil
}

// convFuseKernels lets Conv2DFused run on the fused kernels (gn_affine and
// the implicit GEMM's input map and epilogue terms); off, it runs the
// separate ops on CUDA too. Off until the fused kernels have run on a GPU
// machine (written and emulated on the host: scripts/cuda-emu.sh unet).
// GPUKIT_CONV_FUSE=1 turns it on for a process (a benchmark of a tool).
var convFuseKernels = os.Getenv("GPUKIT_CONV_FUSE") == "1"

// convFusedOK reports whether the implicit GEMM computes Conv2DFused for
// these tensors: the fused kernels are on (convFuseKernels), no dilation
// and one group (the fused kernel's only geometry), the forward's path is
// an implicit GEMM (igemmOK), Cout is even (the epilogue's pairs) and the
// fused operands are 16-byte aligned.
func (c *cudaImpl) convFusedOK(x, w, y, b *tensor.Tensor, f ConvFused, s *convShape) bool {
	return convFuseKernels && !s.direct && !s.pointwise && s.cout%2 == 0 &&
		igemmOK(convPath, s.cin, s.cout, x, w, y, b, f.NBias, f.Res, f.NormW, f.NormB)
}

// conv2dFused runs Conv2DFused on the implicit GEMM: gn_affine writes the
// normalisation's per-sample scale and shift ([N, Cin] f32 each, scratch),
// which the convolution applies to its input tiles.
func (c *cudaImpl) conv2dFused(x, w, b, y *tensor.Tensor, f ConvFused, s *convShape) error {
	a := launch.ConvIgemmArgs{X: devPtr(x), W: devPtr(w), Y: devPtr(y), N: int32(s.n), H: int32(s.h), W_: int32(s.w),
		Cin: int32(s.cin), Ho: int32(s.ho), Wo: int32(s.wo), Cout: int32(s.cout), Kh: int32(s.kh), Kw: int32(s.kw),
		Stride: int32(s.stride), Pad: int32(s.pad), Bias: devPtr(b), Nbias: devPtr(f.NBias), Res: devPtr(f.Res)}
	if f.Groups > 0 {
		n := int64(s.n) * int64(s.cin) * 4
		scale, err := c.Scratch("conv2d.pro_scale", n)
		if err != nil {
			return err
		}
		shift, err := c.Scratch("conv2d.pro_shift", n)
		if err != nil {
			return err
		}
		gs := gnShape{n: s.n, s: s.h * s.w, c: s.cin, g: f.Groups}
		p := gnPlanFor(&gs, rwVecOK([]*tensor.Tensor{x, f.NormW, f.NormB}))
		if err := p.check(); err != nil {
			return err
		}
		if err := launch.GnAffine(c, p.inst+"_bf16", grid1(s.n), [3]uint32{uint32(p.bx), uint32(p.by), 1}, p.smem,
			scale, shift, 0, 0, devPtr(x), devPtr(f.NormW), devPtr(f.NormB), int32(gs.s), int32(gs.c), int32(gs.g), f.Eps); err != nil {
			return err
		}
		a.ProScale, a.ProShift, a.ProSilu = scale, shift, launch.Bool(f.SiLU)
	}
	return c.convIgemmLaunch(convPath, &a)
}

// ConvGN is the GroupNorm (and SiLU) Graph.ConvBlock applies to its input.
type ConvGN struct {
	W, B   *Var // [Cin] f32 scale and shift, or nil (ones, zeros)
	Groups int
	Eps    float32
	SiLU   bool
	// Dropout is the probability of Graph.Dropout after the norm (training
	// graphs only, as Dropout).
	Dropout float32
}

// ConvBlock records y = Conv2D(m(x), w, b, p) + nbias[n] + res, m the
// GroupNorm+SiLU(+dropout) gn (nil: the identity), nbias [N, Cout] and res
// of y's shape (either nil: none); p as Graph.Conv2D takes it (dilation
// and groups included). A forward-only graph (GraphOptions.Eval) records
// one node, Engine.Conv2DFused, which on CUDA maps the input inside the
// convolution's tile loads and adds the terms in its epilogue (for d = 1,
// G = 1; otherwise it runs the separate ops); any other graph records the
// separate ops (GroupNorm, Dropout, Conv2D, AddChannels, Add), whose
// gradients it has. Operands are cast to the graph's activation dtype as
// Conv2D casts them (the norm's W and B stay f32).
func (g *Graph) ConvBlock(x *Var, gn *ConvGN, w, b, nbias, res *Var, p Conv2DParams) *Var {
	if !g.ok(x, w) {
		return nil
	}
	if !g.opts.Eval {
		h := x
		if gn != nil {
			h = g.Dropout(g.GroupNorm(h, gn.W, gn.B, gn.Groups, gn.Eps, gn.SiLU), gn.Dropout)
		}
		y := g.Conv2D(h, w, b, p)
		if nbias != nil {
			y = g.AddChannels(y, nbias)
		}
		if res != nil {
			y = g.Add(res, y)
		}
		return y
	}
	g.prefetch("conv2d.cu")
	s, err := convShapeOf("convblock", x.Value.Shape, w.Value.Shape, p)
	if err != nil {
		g.Fail("convblock", err)
		return nil
	}
	dt := g.ActDType()
	x, w = g.Cast(x, dt), g.Cast(w, dt)
	in := []*Var{x, w}
	opt := func(v *Var) *Var {
		if v == nil {
			return nil
		}
		if v = g.Cast(v, dt); v != nil {
			in = append(in, v)
		}
		return v
	}
	b, nbias, res = opt(b), opt(nbias), opt(res)
	var f ConvFused
	var nw, nb *Var
	if gn != nil {
		g.prefetch("groupnorm.cu")
		f.Groups, f.Eps, f.SiLU = gn.Groups, gn.Eps, gn.SiLU
		for _, v := range []*Var{gn.W, gn.B} {
			if v != nil {
				in = append(in, v)
			}
		}
		nw, nb = gn.W, gn.B
	}
	y := g.NewOut("convblock", dt, s.n, s.ho, s.wo, s.cout)
	if !g.ok(y) || !g.ok(in...) {
		return nil
	}
	val := func(v *Var) *tensor.Tensor {
		if v == nil {
			return nil
		}
		return v.Value
	}
	e := g.e
	g.Record("convblock", in, []*Var{y}, func(*Grads) error {
		f := f
		f.NormW, f.NormB, f.NBias, f.Res = val(nw), val(nb), val(nbias), val(res)
		return e.Conv2DFused(y.Value, x.Value, w.Value, val(b), p, f)
	}, nil)
	return y
}
