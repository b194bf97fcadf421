package opstest

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"gpukit/libgpu/device"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

func init() { Register(Family{Name: "conv2d", Check: checkConv2D}) }

// ConvGeom is a convolution's geometry for the references: x [N,H,W,Cin],
// w [Cout,KH,KW,Cin/G], stride S, padding P, dilation D and G groups (D
// and G as ops.Conv2DParams has them: 0 means 1).
type ConvGeom struct {
	N, H, W, Cin, Cout, KH, KW, S, P int
	D, G                             int
}

// Dil and Groups are D and G with 0 read as 1.
func (g ConvGeom) Dil() int    { return max(g.D, 1) }
func (g ConvGeom) Groups() int { return max(g.G, 1) }

// CinG is Cin/G, w's last dimension.
func (g ConvGeom) CinG() int { return g.Cin / g.Groups() }

// Params are the geometry's ops.Conv2DParams.
func (g ConvGeom) Params() ops.Conv2DParams {
	return ops.Conv2DParams{Stride: g.S, Pad: g.P, Dilation: g.D, Groups: g.G}
}

// Out is (Ho, Wo).
func (g ConvGeom) Out() (int, int) {
	return ops.ConvOutSize(g.H, g.KH, g.S, g.P, g.Dil()), ops.ConvOutSize(g.W, g.KW, g.S, g.P, g.Dil())
}

// name is the geometry as a subtest name: x…/w…/sSpP, then dg().
func (g ConvGeom) name() string {
	return fmt.Sprintf("x%dx%dx%dx%d/w%dx%dx%d/s%dp%d%s", g.N, g.H, g.W, g.Cin, g.Cout, g.KH, g.KW, g.S, g.P, g.dg())
}

// dg is "dD" and "gG" for a dilation and groups other than 1, else "".
func (g ConvGeom) dg() string {
	n := ""
	if g.Dil() != 1 {
		n += fmt.Sprintf("d%d", g.Dil())
	}
	if g.Groups() != 1 {
		n += fmt.Sprintf("g%d", g.Groups())
	}
	return n
}

// RefConv2D is the float64 reference of ops.Engine.Conv2D (PyTorch's
// nn.Conv2d cross-correlation, channels-last): y[n,i,j,o] = b[o] +
// Σ x[n, i·S−P+kh·D, j·S−P+kw·D, g·Cin/G + c]·w[o,kh,kw,c] over c <
// Cin/G, g = ⌊o/(Cout/G)⌋ the group of o. b may be nil.
func RefConv2D(x, w, b []float64, g ConvGeom) []float64 {
	ho, wo := g.Out()
	d, cig, cog := g.Dil(), g.CinG(), g.Cout/g.Groups()
	y := make([]float64, g.N*ho*wo*g.Cout)
	for n := 0; n < g.N; n++ {
		for i := 0; i < ho; i++ {
			for j := 0; j < wo; j++ {
				out := y[((n*ho+i)*wo+j)*g.Cout:]
				for o := 0; o < g.Cout; o++ {
					c0 := o / cog * cig
					var s float64
					if b != nil {
						s = b[o]
					}
					for kh := 0; kh < g.KH; kh++ {
						h := i*g.S - g.P + kh*d
						if h < 0 || h >= g.H {
							continue
						}
						for kw := 0; kw < g.KW; kw++ {
							ww := j*g.S - g.P + kw*d
							if ww < 0 || ww >= g.W {
								continue
							}
							xr := x[((n*g.H+h)*g.W+ww)*g.Cin+c0:]
							wr := w[((o*g.KH+kh)*g.KW+kw)*cig:]
							for c := 0; c < cig; c++ {
								s += xr[c] * wr[c]
							}
						}
					}
					out[o] = s
				}
			}
		}
	}
	return y
}

// RefConv2DBackward is the float64 reference of the gradients of Conv2D
// (derived from the forward by the chain rule: each product x·w sends
// dy·w to x and dy·x to w; db sums dy over every position).
func RefConv2DBackward(dy, x, w []float64, g ConvGeom) (dx, dw, db []float64) {
	ho, wo := g.Out()
	d, cig, cog := g.Dil(), g.CinG(), g.Cout/g.Groups()
	dx = make([]float64, len(x))
	dw = make([]float64, len(w))
	db = make([]float64, g.Cout)
	for n := 0; n < g.N; n++ {
		for i := 0; i < ho; i++ {
			for j := 0; j < wo; j++ {
				gr := dy[((n*ho+i)*wo+j)*g.Cout:]
				for o := 0; o < g.Cout; o++ {
					c0 := o / cog * cig
					dv := gr[o]
					db[o] += dv
					for kh := 0; kh < g.KH; kh++ {
						h := i*g.S - g.P + kh*d
						if h < 0 || h >= g.H {
							continue
						}
						for kw := 0; kw < g.KW; kw++ {
							ww := j*g.S - g.P + kw*d
							if ww < 0 || ww >= g.W {
								continue
							}
							xo := ((n*g.H+h)*g.W+ww)*g.Cin + c0
							wo := ((o*g.KH+kh)*g.KW + kw) * cig
							for c := 0; c < cig; c++ {
								dx[xo+c] += dv * w[wo+c]
								dw[wo+c] += dv * x[xo+c]
							}
						}
					}
				}
			}
		}
	}
	return dx, dw, db
}

// convGeoms reach every path: 3×3 same padding (vectorised channels at
// Cin = 8, 16; scalar at odd Cin), stride 2, no padding, 1×1 pointwise (a
// plain GEMM), 1×1 strided (im2col), non-square images and kernels, a
// kernel that covers the whole image.
var convGeoms = []ConvGeom{
	{N: 1, H: 5, W: 5, Cin: 3, Cout: 4, KH: 3, KW: 3, S: 1, P: 1},
	{N: 2, H: 7, W: 6, Cin: 5, Cout: 3, KH: 3, KW: 3, S: 2, P: 1},
	{N: 3, H: 6, W: 6, Cin: 8, Cout: 16, KH: 3, KW: 3, S: 1, P: 1},
	{N: 2, H: 4, W: 5, Cin: 16, Cout: 7, KH: 3, KW: 3, S: 1, P: 0},
	{N: 2, H: 4, W: 4, Cin: 9, Cout: 17, KH: 1, KW: 1, S: 1, P: 0},
	{N: 1, H: 6, W: 5, Cin: 2, Cout: 3, KH: 1, KW: 1, S: 2, P: 0},
	{N: 2, H: 5, W: 7, Cin: 3, Cout: 2, KH: 2, KW: 3, S: 1, P: 1},
	{N: 1, H: 3, W: 3, Cin: 4, Cout: 5, KH: 3, KW: 3, S: 3, P: 0},
	// Channels the CUDA backend's implicit GEMM takes in bf16 (Cin a
	// multiple of 32): partial row and channel blocks, stride 2, the input
	// gradient through flipped filters (Cout a multiple of 32), one output
	// channel.
	{N: 2, H: 5, W: 6, Cin: 32, Cout: 24, KH: 3, KW: 3, S: 1, P: 1},
	{N: 1, H: 7, W: 7, Cin: 64, Cout: 8, KH: 3, KW: 3, S: 2, P: 1},
	{N: 2, H: 4, W: 5, Cin: 32, Cout: 32, KH: 3, KW: 3, S: 1, P: 1},
	{N: 2, H: 4, W: 4, Cin: 64, Cout: 1, KH: 3, KW: 3, S: 1, P: 1},
	// Shapes Hopper's wgmma kernels take (Cin a multiple of 64, Cout of 8),
	// with TMA loads too (ops' convTMA): 189 output pixels (a second, partial
	// row block whose rows run past the last image) and 72 channels (a
	// partial channel block); the input gradient through flipped filters on
	// the same kernels (Cin and Cout 64); a non-square kernel without
	// padding (the im2col map's bounding box per axis).
	{N: 3, H: 9, W: 7, Cin: 128, Cout: 72, KH: 3, KW: 3, S: 1, P: 1},
	{N: 2, H: 6, W: 5, Cin: 64, Cout: 64, KH: 3, KW: 3, S: 1, P: 1},
	{N: 2, H: 5, W: 6, Cin: 64, Cout: 16, KH: 1, KW: 3, S: 1, P: 0},
	// Dilation and groups (the host's GEMM a group; CUDA's direct
	// kernels): dilation 2 at odd sizes with padding 2; padding 4 below a
	// dilated 3×3 kernel's extent of 5 (as large as allowed); groups 2;
	// depthwise (G = Cin = Cout); dilation, groups, stride 2, a
	// non-square image and kernel at once; one input and three outputs a
	// group; a grouped 1×1 (the host's pointwise GEMM a group); shapes the
	// implicit GEMM would take in bf16 but for the dilation or the groups.
	{N: 2, H: 7, W: 9, Cin: 3, Cout: 5, KH: 3, KW: 3, S: 1, P: 2, D: 2},
	{N: 1, H: 5, W: 5, Cin: 2, Cout: 3, KH: 3, KW: 3, S: 1, P: 4, D: 2},
	{N: 2, H: 5, W: 6, Cin: 4, Cout: 6, KH: 3, KW: 3, S: 1, P: 1, G: 2},
	{N: 2, H: 6, W: 5, Cin: 8, Cout: 8, KH: 3, KW: 3, S: 1, P: 1, G: 8},
	{N: 2, H: 9, W: 7, Cin: 6, Cout: 9, KH: 3, KW: 2, S: 2, P: 1, D: 2, G: 3},
	{N: 1, H: 5, W: 5, Cin: 4, Cout: 12, KH: 3, KW: 3, S: 1, P: 1, G: 4},
	{N: 2, H: 4, W: 3, Cin: 6, Cout: 4, KH: 1, KW: 1, S: 1, P: 0, G: 2},
	{N: 2, H: 5, W: 6, Cin: 64, Cout: 32, KH: 3, KW: 3, S: 1, P: 1, G: 2},
	{N: 1, H: 7, W: 7, Cin: 32, Cout: 8, KH: 3, KW: 3, S: 1, P: 2, D: 2},
}

// convGradCase is a finite-difference check of Graph.Conv2D at g, with a
// bias or without, the op recorded once or twice (GradCase.Twice).
type convGradCase struct {
	name        string
	g           ConvGeom
	bias, twice bool
}

// convGradCases: 3×3 same padding, stride 2, dilation 2 (padding 2, odd
// sizes), groups 2 (stride 2).
var convGradCases = []convGradCase{
	{"grad", ConvGeom{N: 2, H: 4, W: 3, Cin: 3, Cout: 2, KH: 3, KW: 3, S: 1, P: 1}, true, true},
	{"grad-strided", ConvGeom{N: 1, H: 5, W: 5, Cin: 2, Cout: 3, KH: 3, KW: 3, S: 2, P: 1}, false, false},
	{"grad-dilated", ConvGeom{N: 1, H: 6, W: 5, Cin: 2, Cout: 3, KH: 3, KW: 3, S: 1, P: 2, D: 2}, true, false},
	{"grad-grouped", ConvGeom{N: 2, H: 4, W: 5, Cin: 4, Cout: 6, KH: 3, KW: 3, S: 2, P: 1, G: 2}, true, true},
}

// convGradCheck runs c through Suite.GradCheck: x in dt, w and b f32
// masters (cast to dt by the graph).
func convGradCheck(s *Suite, dt tensor.DType, c convGradCase) {
	g := c.g
	params := [][]int{{g.N, g.H, g.W, g.Cin}, {g.Cout, g.KH, g.KW, g.CinG()}}
	pdts := []tensor.DType{0, tensor.F32}
	if c.bias {
		params, pdts = append(params, []int{g.Cout}), append(pdts, tensor.F32)
	}
	s.GradCheck(GradCase{
		Name: "conv2d " + c.name, DType: dt, Params: params, PDTypes: pdts, Twice: c.twice,
		TolB: convGradTol(s, dt), TolF: convFwdTol(s, dt),
		Record: func(gr *ops.Graph, p, _ []*ops.Var) *ops.Var {
			var b *ops.Var
			if c.bias {
				b = p[2]
			}
			return gr.Conv2D(p[0], p[1], b, g.Params())
		},
		Ref: func(p [][]float64) []float64 {
			var b []float64
			if c.bias {
				b = p[2]
			}
			return RefConv2D(p[0], p[1], b, g)
		},
	})
}

func checkConv2D(s *Suite) {
	for _, dt := range s.DTypes() {
		for _, g := range convGeoms {
			s.Run(fmt.Sprintf("%v/%s", dt, g.name()), func(s *Suite) { convForwardBackward(s, dt, g) })
		}
		for _, c := range convGradCases {
			s.Run(fmt.Sprintf("%v/%s", dt, c.name), func(s *Suite) { convGradCheck(s, dt, c) })
		}
	}
	for _, dt := range s.DTypes() {
		for _, c := range convFusedCases {
			s.Run(fmt.Sprintf("%v/fused/x%dx%dx%dx%d→%d%s/G%d/norm=%v/nbias=%v/res=%v", dt, c.g.N, c.g.H, c.g.W, c.g.Cin, c.g.Cout,
				c.g.dg(), c.groups, c.norm, c.nbias, c.res), func(s *Suite) { convFused(s, dt, c) })
		}
	}
	for _, dt := range s.DTypes() {
		for _, g := range convBlockGeoms {
			s.Run(fmt.Sprintf("%v/convblock%s", dt, strings.TrimSuffix("-"+g.dg(), "-")), func(s *Suite) { convBlockGraphs(s, dt, g) })
		}
	}
	s.Run("validation", convValidation)
	s.Run("eval-graph-gradients", func(s *Suite) {
		gr := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Eval: true})
		defer gr.Free()
		if err := gr.Build(true); err == nil {
			s.T.Error("a forward-only graph built gradients")
		}
	})
}

// convBlockGeoms are convBlockGraphs' geometries: the U-Net's 3×3 (the
// fused kernel on CUDA), and a dilated grouped one (the separate ops in
// both graphs).
var convBlockGeoms = []ConvGeom{
	{N: 2, H: 5, W: 6, Cin: 32, Cout: 24, KH: 3, KW: 3, S: 1, P: 1},
	{N: 2, H: 5, W: 6, Cin: 32, Cout: 24, KH: 3, KW: 3, S: 1, P: 2, D: 2, G: 4},
}

// convBlockGraphs records Graph.ConvBlock (GroupNorm+SiLU, a per-sample
// bias, a residual) in a forward-only graph (GraphOptions.Eval: one fused
// node) and in a training graph (the separate ops) on the same tensors: the forward
// outputs agree within the fused op's bound (bitwise on the host, where the
// fused op runs the separate ops), and the training graph's backward runs.
func convBlockGraphs(s *Suite, dt tensor.DType, g ConvGeom) {
	ho, wo := g.Out()
	x, _ := s.Rand(dt, 1, g.N, g.H, g.W, g.Cin)
	w, _ := s.Rand(dt, 0.5, g.Cout, g.KH, g.KW, g.CinG())
	b, _ := s.Rand(dt, 1, g.Cout)
	gw, _ := s.Rand(tensor.F32, 1, g.Cin)
	gb, _ := s.Rand(tensor.F32, 1, g.Cin)
	nb, _ := s.Rand(dt, 1, g.N, g.Cout)
	r, _ := s.Rand(dt, 1, g.N, ho, wo, g.Cout)
	run := func(train bool) []float64 {
		gr := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Train: train, Eval: !train, Autocast: dt})
		defer gr.Free()
		var grads []*tensor.Tensor
		param := func(name string, v *tensor.Tensor) *ops.Var {
			if !train {
				return gr.Param(name, v, nil)
			}
			d := s.Empty(v.DType, v.Shape...)
			grads = append(grads, d)
			return gr.Param(name, v, d)
		}
		y := gr.ConvBlock(param("x", x), &ops.ConvGN{W: param("gn.w", gw), B: param("gn.b", gb), Groups: 8, Eps: gnEps, SiLU: true},
			param("w", w), param("b", b), param("nbias", nb), param("res", r), g.Params())
		var out []float64
		if train {
			gr.MSELoss(y, gr.Input("target", s.Empty(dt, g.N, ho, wo, g.Cout)))
		}
		s.NoErr("convblock build", gr.Build(train))
		s.NoErr("convblock forward", gr.Forward())
		out = s.Read(y.Value)
		if train {
			s.NoErr("convblock backward", gr.Backward())
		}
		return out
	}
	fused, sep := run(false), run(true)
	if s.E.Device().Kind() == device.KindHost {
		for i := range fused {
			if fused[i] != sep[i] {
				s.T.Fatalf("element %d: the evaluation graph's %v, the training graph's %v", i, fused[i], sep[i])
			}
		}
		return
	}
	// A wiring check (convFused holds the op to float64 and its terms):
	// errors relative to the largest output.
	top := 0.0
	for _, v := range sep {
		top = max(top, math.Abs(v))
	}
	scale := make([]float64, len(sep))
	for i := range scale {
		scale[i] = top
	}
	s.Close("evaluation graph against training graph", fused, sep, scale, 2*convFwdTol(s, dt))
}

// convFusedCases reach Conv2DFused's CUDA paths in bf16: the implicit GEMM
// with every fused term (Cin a multiple of 32, Cout even; stride 2; terms
// left out), the composed ops where it does not apply (one output
// channel, a small Cin, a dilated grouped convolution), and every path
// in f32.
var convFusedCases = []struct {
	g                ConvGeom
	groups           int
	norm, nbias, res bool
}{
	{ConvGeom{N: 2, H: 5, W: 6, Cin: 32, Cout: 24, KH: 3, KW: 3, S: 1, P: 1}, 8, true, true, true},
	{ConvGeom{N: 1, H: 7, W: 7, Cin: 64, Cout: 8, KH: 3, KW: 3, S: 2, P: 1}, 32, true, false, true},
	{ConvGeom{N: 2, H: 4, W: 5, Cin: 32, Cout: 32, KH: 3, KW: 3, S: 1, P: 1}, 4, false, true, false},
	{ConvGeom{N: 2, H: 4, W: 4, Cin: 64, Cout: 1, KH: 3, KW: 3, S: 1, P: 1}, 32, true, true, true},
	{ConvGeom{N: 1, H: 5, W: 5, Cin: 3, Cout: 4, KH: 3, KW: 3, S: 1, P: 1}, 1, true, true, true},
	{ConvGeom{N: 2, H: 5, W: 6, Cin: 32, Cout: 24, KH: 3, KW: 3, S: 1, P: 2, D: 2, G: 2}, 8, true, true, true},
}

// convFused checks Engine.Conv2DFused against the float64 GroupNorm+SiLU,
// convolution and additions, with errors relative to the terms (the
// convolution of |m(x)| with |w|, plus |b|, |nbias| and |res|).
func convFused(s *Suite, dt tensor.DType, c struct {
	g                ConvGeom
	groups           int
	norm, nbias, res bool
}) {
	g := c.g
	ho, wo := g.Out()
	x, xv := s.Rand(dt, 1, g.N, g.H, g.W, g.Cin)
	w, wv := s.Rand(dt, 0.5, g.Cout, g.KH, g.KW, g.CinG())
	b, bv := s.Rand(dt, 1, g.Cout)
	f := ops.ConvFused{}
	act := xv
	if c.norm {
		gw, gwv := s.Rand(tensor.F32, 1, g.Cin)
		gb, gbv := s.Rand(tensor.F32, 1, g.Cin)
		f.Groups, f.NormW, f.NormB, f.Eps, f.SiLU = c.groups, gw, gb, gnEps, true
		act, _, _ = RefGroupNorm(xv, gwv, gbv, GNGeom{N: g.N, S: g.H * g.W, C: g.Cin, G: c.groups}, gnEps, true)
	}
	want := RefConv2D(act, wv, bv, g)
	terms := RefConv2D(Abs(act), Abs(wv), Abs(bv), g)
	if c.nbias {
		nb, nbv := s.Rand(dt, 1, g.N, g.Cout)
		f.NBias = nb
		for i := range want {
			j := (i/(ho*wo*g.Cout))*g.Cout + i%g.Cout
			want[i] += nbv[j]
			terms[i] += math.Abs(nbv[j])
		}
	}
	if c.res {
		r, rv := s.Rand(dt, 1, g.N, ho, wo, g.Cout)
		f.Res = r
		for i := range want {
			want[i] += rv[i]
			terms[i] += math.Abs(rv[i])
		}
	}
	y := s.Empty(dt, g.N, ho, wo, g.Cout)
	s.NoErr("conv2d fused", s.E.Conv2DFused(y, x, w, b, g.Params(), f))
	// The normalised input is rounded to the activation dtype first, as a
	// separate GroupNorm stores it: twice the convolution's bound.
	s.Close("y", s.Read(y), want, terms, 2*convFwdTol(s, dt))
}

// convFwdTol is the relative error bound of a convolution's output: the
// GEMM family's (bf16 products and storage 1e-2; TF32 1e-3).
func convFwdTol(s *Suite, dt tensor.DType) float64 { return 2 * s.GemmTol(dt) }

// convGradTol bounds gradient errors against finite differences (which
// carry their own error) and, in bf16, the rounding of the column
// gradients before they are folded back.
func convGradTol(s *Suite, dt tensor.DType) float64 {
	if dt == tensor.BF16 {
		return 5e-2
	}
	return max(1e-3, 10*s.GemmTol(dt))
}

func convForwardBackward(s *Suite, dt tensor.DType, g ConvGeom) {
	ho, wo := g.Out()
	x, xv := s.Rand(dt, 1, g.N, g.H, g.W, g.Cin)
	w, wv := s.Rand(dt, 0.5, g.Cout, g.KH, g.KW, g.CinG())
	b, bv := s.Rand(dt, 1, g.Cout)
	p := g.Params()
	tol := convFwdTol(s, dt)
	// Reduced precision rounds the operands: errors are bounded by the
	// magnitude of the terms (the convolution of |x| with |w|).
	for _, withBias := range []bool{true, false} {
		y := s.Empty(dt, g.N, ho, wo, g.Cout)
		var bt *tensor.Tensor
		var bb []float64
		if withBias {
			bt, bb = b, bv
		}
		s.NoErr("conv2d", s.E.Conv2D(y, x, w, bt, p))
		s.Close(fmt.Sprintf("y (bias=%v)", withBias), s.Read(y), RefConv2D(xv, wv, bb, g), RefConv2D(Abs(xv), Abs(wv), Abs(bb), g), tol)
	}

	dy, dyv := s.Rand(dt, 1, g.N, ho, wo, g.Cout)
	wdx, wdw, wdb := RefConv2DBackward(dyv, xv, wv, g)
	// The terms: the same sums of |dy|, |x| and |w|.
	tdx, tdw, tdb := RefConv2DBackward(Abs(dyv), Abs(xv), Abs(wv), g)
	gtol := tol
	if dt == tensor.BF16 {
		gtol = 2e-2 // column gradients are rounded to bf16 before they are summed
	}
	for _, gdt := range []tensor.DType{tensor.F32, dt} {
		dx := s.Empty(dt, g.N, g.H, g.W, g.Cin)
		dw := s.Empty(gdt, g.Cout, g.KH, g.KW, g.CinG())
		db := s.Empty(gdt, g.Cout)
		s.NoErr("conv2d backward", s.E.Conv2DBackward(dx, dw, db, dy, x, w, p, [3]bool{}))
		s.Close("dx", s.Read(dx), wdx, tdx, gtol)
		s.Close(fmt.Sprintf("dw (%v)", gdt), s.Read(dw), wdw, tdw, gtol)
		s.Close(fmt.Sprintf("db (%v)", gdt), s.Read(db), wdb, tdb, gtol)
	}
	// Accumulate onto what is there: each flag alone, then all.
	for _, acc := range [][3]bool{{true, false, false}, {false, true, false}, {false, false, true}, {true, true, true}} {
		dx0, dx0v := s.Rand(dt, 1, g.N, g.H, g.W, g.Cin)
		dw0, dw0v := s.Rand(tensor.F32, 1, g.Cout, g.KH, g.KW, g.CinG())
		db0, db0v := s.Rand(tensor.F32, 1, g.Cout)
		s.NoErr("conv2d backward (acc)", s.E.Conv2DBackward(dx0, dw0, db0, dy, x, w, p, acc))
		for i, c := range []struct {
			what             string
			t                *tensor.Tensor
			old, want, terms []float64
		}{{"dx", dx0, dx0v, wdx, tdx}, {"dw", dw0, dw0v, wdw, tdw}, {"db", db0, db0v, wdb, tdb}} {
			want, terms := c.want, c.terms
			if acc[i] {
				want, terms = lnSum(c.old, c.want), Sum(c.old, c.terms)
			}
			s.Close(fmt.Sprintf("%s (acc=%v)", c.what, acc), s.Read(c.t), want, terms, gtol)
		}
	}
	// Only some gradients wanted.
	dx1 := s.Empty(dt, g.N, g.H, g.W, g.Cin)
	s.NoErr("conv2d backward (dx only)", s.E.Conv2DBackward(dx1, nil, nil, dy, x, w, p, [3]bool{}))
	s.Close("dx (alone)", s.Read(dx1), wdx, tdx, gtol)
	dw1 := s.Empty(tensor.F32, g.Cout, g.KH, g.KW, g.CinG())
	s.NoErr("conv2d backward (dw only)", s.E.Conv2DBackward(nil, dw1, nil, dy, x, w, p, [3]bool{}))
	s.Close("dw (alone)", s.Read(dw1), wdw, tdw, gtol)
}

func convValidation(s *Suite) {
	x := s.Empty(tensor.F32, 2, 5, 5, 3)
	w := s.Empty(tensor.F32, 4, 3, 3, 3)
	y := s.Empty(tensor.F32, 2, 5, 5, 4)
	ok := ops.Conv2DParams{Stride: 1, Pad: 1}
	for _, c := range []struct {
		what string
		err  error
	}{
		{"w with another Cin", s.E.Conv2D(y, x, s.Empty(tensor.F32, 4, 3, 3, 2), nil, ok)},
		{"y of the wrong shape", s.E.Conv2D(s.Empty(tensor.F32, 2, 4, 4, 4), x, w, nil, ok)},
		{"y of another dtype", s.E.Conv2D(s.Empty(tensor.BF16, 2, 5, 5, 4), x, w, nil, ok)},
		{"w of another dtype", s.E.Conv2D(y, x, s.Empty(tensor.BF16, 4, 3, 3, 3), nil, ok)},
		{"bias of the wrong size", s.E.Conv2D(y, x, w, s.Empty(tensor.F32, 3), ok)},
		{"stride 0", s.E.Conv2D(y, x, w, nil, ops.Conv2DParams{Stride: 0, Pad: 1})},
		{"padding as large as the kernel", s.E.Conv2D(s.Empty(tensor.F32, 2, 9, 9, 4), x, w, nil, ops.Conv2DParams{Stride: 1, Pad: 3})},
		{"negative padding", s.E.Conv2D(y, x, w, nil, ops.Conv2DParams{Stride: 1, Pad: -1})},
		{"rank-3 x", s.E.Conv2D(y, s.Empty(tensor.F32, 5, 5, 3), w, nil, ok)},
		{"kernel larger than the image", s.E.Conv2D(y, s.Empty(tensor.F32, 2, 1, 1, 3), w, nil, ops.Conv2DParams{Stride: 1})},
		{"i32 x", s.E.Conv2D(y, s.Empty(tensor.I32, 2, 5, 5, 3), w, nil, ok)},
		{"backward dy of the wrong shape", s.E.Conv2DBackward(nil, nil, nil, s.Empty(tensor.F32, 2, 5, 5, 3), x, w, ok, [3]bool{})},
		{"backward dw of the wrong shape", s.E.Conv2DBackward(nil, s.Empty(tensor.F32, 4, 3, 3, 2), nil, y, x, w, ok, [3]bool{})},
		{"backward dx of another dtype", s.E.Conv2DBackward(s.Empty(tensor.BF16, 2, 5, 5, 3), nil, nil, y, x, w, ok, [3]bool{})},
		{"fused nbias of the wrong shape", s.E.Conv2DFused(y, x, w, nil, ok, ops.ConvFused{NBias: s.Empty(tensor.F32, 2, 3)})},
		{"fused res of the wrong shape", s.E.Conv2DFused(y, x, w, nil, ok, ops.ConvFused{Res: s.Empty(tensor.F32, 2, 5, 5, 3)})},
		{"fused groups not dividing Cin", s.E.Conv2DFused(y, x, w, nil, ok, ops.ConvFused{Groups: 2, Eps: 1e-5})},
		{"fused negative eps", s.E.Conv2DFused(y, x, w, nil, ok, ops.ConvFused{Groups: 1, Eps: -1})},
	} {
		if c.err == nil {
			s.T.Errorf("%s: accepted", c.what)
		}
	}
	tr, _ := x.Transpose(1, 2)
	if err := s.E.Conv2D(y, tr, w, nil, ok); err == nil {
		s.T.Error("a non-contiguous x was accepted")
	}
	gr := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{})
	defer gr.Free()
	if gr.Conv2D(gr.Input("x", x), gr.Input("w", s.Empty(tensor.F32, 4, 3, 3, 2)), nil, ok) != nil || gr.Err() == nil {
		s.T.Error("graph conv2d with mismatched channels was recorded")
	}
	convValidationDG(s)
}

// convValidationDG checks what dilation and groups add to the validation
// (each error's sentinel and the values it names; the graph refusing at
// recording, Conv2D and ConvBlock's evaluation node alike) and that the
// largest padding a dilated kernel allows is accepted.
func convValidationDG(s *Suite) {
	x := s.Empty(tensor.F32, 2, 5, 5, 6)
	w := s.Empty(tensor.F32, 4, 3, 3, 3) // two groups of three input channels
	y := s.Empty(tensor.F32, 2, 5, 5, 4)
	g2 := ops.Conv2DParams{Stride: 1, Pad: 1, Groups: 2}
	s.NoErr("conv2d groups 2", s.E.Conv2D(y, x, w, nil, g2))
	s.NoErr("conv2d dilation 2, padding 4 (below the extent 5)",
		s.E.Conv2D(s.Empty(tensor.F32, 2, 9, 9, 4), x, w, nil, ops.Conv2DParams{Stride: 1, Pad: 4, Dilation: 2, Groups: 2}))
	for _, c := range []struct {
		what string
		err  error
		want error
		says string // a part of the message: the bad values
	}{
		{"groups not dividing Cin", s.E.Conv2D(y, x, s.Empty(tensor.F32, 4, 3, 3, 1), nil, ops.Conv2DParams{Stride: 1, Pad: 1, Groups: 4}),
			ops.ErrConfig, "6 input and 4 output channels in 4 groups"},
		{"groups not dividing Cout", s.E.Conv2D(y, x, s.Empty(tensor.F32, 4, 3, 3, 2), nil, ops.Conv2DParams{Stride: 1, Pad: 1, Groups: 3}),
			ops.ErrConfig, "6 input and 4 output channels in 3 groups"},
		{"w's last dimension Cin, not Cin/G", s.E.Conv2D(y, x, s.Empty(tensor.F32, 4, 3, 3, 6), nil, g2),
			tensor.ErrShape, "[4 3 3 6] for 6 input channels in 2 groups"},
		{"w's last dimension not Cin/G", s.E.Conv2D(y, x, s.Empty(tensor.F32, 4, 3, 3, 2), nil, g2),
			tensor.ErrShape, "want w [Cout,KH,KW,3]"},
		{"negative dilation", s.E.Conv2D(y, x, w, nil, ops.Conv2DParams{Stride: 1, Pad: 1, Dilation: -1, Groups: 2}),
			ops.ErrConfig, "dilation -1"},
		{"negative groups", s.E.Conv2D(y, x, w, nil, ops.Conv2DParams{Stride: 1, Pad: 1, Groups: -2}),
			ops.ErrConfig, "groups -2"},
		{"padding as large as the dilated kernel", s.E.Conv2D(s.Empty(tensor.F32, 2, 11, 11, 4), x, w, nil,
			ops.Conv2DParams{Stride: 1, Pad: 5, Dilation: 2, Groups: 2}), ops.ErrConfig, "padding 5 with a 3×3 kernel at dilation 2"},
		{"padding as large as the dilated kernel's width", s.E.Conv2D(s.Empty(tensor.F32, 2, 7, 5, 4), x, s.Empty(tensor.F32, 4, 3, 1, 3), nil,
			ops.Conv2DParams{Stride: 1, Pad: 1, Dilation: 2, Groups: 2}), ops.ErrConfig, "dilated kernel's 5×1"},
		{"backward groups not dividing Cin", s.E.Conv2DBackward(nil, s.Empty(tensor.F32, 4, 3, 3, 1), nil, y, x, s.Empty(tensor.F32, 4, 3, 3, 1),
			ops.Conv2DParams{Stride: 1, Pad: 1, Groups: 4}, [3]bool{}), ops.ErrConfig, "in 4 groups"},
		{"backward dw of Cin channels at 2 groups", s.E.Conv2DBackward(nil, s.Empty(tensor.F32, 4, 3, 3, 6), nil, y, x, w, g2, [3]bool{}),
			tensor.ErrShape, "backward dw"},
		{"fused negative dilation", s.E.Conv2DFused(y, x, w, nil, ops.Conv2DParams{Stride: 1, Pad: 1, Dilation: -2, Groups: 2}, ops.ConvFused{}),
			ops.ErrConfig, "dilation -2"},
	} {
		switch {
		case c.err == nil:
			s.T.Errorf("%s: accepted", c.what)
		case !errors.Is(c.err, c.want):
			s.T.Errorf("%s: %v, want %v", c.what, c.err, c.want)
		case !strings.Contains(c.err.Error(), c.says):
			s.T.Errorf("%s: %q does not say %q", c.what, c.err, c.says)
		}
	}
	for _, c := range []struct {
		what string
		w    []int
		p    ops.Conv2DParams
		want error
	}{
		{"groups not dividing Cin", []int{4, 3, 3, 1}, ops.Conv2DParams{Stride: 1, Pad: 1, Groups: 4}, ops.ErrConfig},
		{"w's last dimension not Cin/G", []int{4, 3, 3, 6}, g2, tensor.ErrShape},
		{"negative dilation", []int{4, 3, 3, 3}, ops.Conv2DParams{Stride: 1, Pad: 1, Dilation: -1, Groups: 2}, ops.ErrConfig},
		{"padding as large as the dilated kernel", []int{4, 3, 3, 3}, ops.Conv2DParams{Stride: 1, Pad: 5, Dilation: 2, Groups: 2}, ops.ErrConfig},
	} {
		for _, eval := range []bool{false, true} {
			gr := ops.NewGraph(s.E, s.A, "", ops.GraphOptions{Eval: eval})
			var v *ops.Var
			if eval {
				v = gr.ConvBlock(gr.Input("x", x), nil, gr.Input("w", s.Empty(tensor.F32, c.w...)), nil, nil, nil, c.p)
			} else {
				v = gr.Conv2D(gr.Input("x", x), gr.Input("w", s.Empty(tensor.F32, c.w...)), nil, c.p)
			}
			if v != nil || !errors.Is(gr.Err(), c.want) {
				s.T.Errorf("graph (eval=%v) with %s: recorded %v, error %v (want %v)", eval, c.what, v != nil, gr.Err(), c.want)
			}
			gr.Free()
		}
	}
}
