package ops

// The conv2d family: 2-D convolution over channels-last (NHWC) images with
// padding, stride, dilation and groups, forward and backward, as im2col +
// the GEMM family (libgpu/kernels/conv2d.cu gathers the columns and
// scatters their gradient back), and Graph.Conv2D. Reference and checks:
// opstest/conv2d.go.
//
// Layouts: images x [N, H, W, Cin] and y [N, Ho, Wo, Cout] contiguous;
// filters w [Cout, KH, KW, Cin/G] for G groups ("KRSC", the filter layout
// of channels-last convolution: the im2col column of output position p is
// (kh, kw, ci) with ci fastest, so both the gather and the GEMM read rows
// contiguous in ci). PyTorch stores Conv2d weights as [Cout, Cin/G, KH,
// KW]; nn.OIHWToKRSC and nn.KRSCToOIHW convert between the two when
// checkpoints are written and read (the same permutation at any G).

import (
	"fmt"
	"os"

	"gonum.org/v1/gonum/blas"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// Conv2DParams are a convolution's stride, zero padding, dilation and
// groups, the same on both spatial axes: PyTorch's nn.Conv2d(stride=s,
// padding=p, dilation=d, groups=G). The zero value of Dilation and of
// Groups means 1, so Conv2DParams{Stride: s, Pad: p} is the convolution
// it always was (no dilation, one group).
type Conv2DParams struct {
	Stride, Pad int
	// Dilation d ≥ 0 (0 means 1) spaces the kernel's taps d apart: tap
	// (kh, kw) of output (i, j) reads x at (i·s − p + kh·d, j·s − p + kw·d).
	Dilation int
	// Groups G ≥ 0 (0 means 1) splits the input and the output channels
	// into G equal groups: output channel o (group o/(Cout/G)) sees only
	// its group's Cin/G input channels, and w is [Cout, KH, KW, Cin/G].
	// G = Cin = Cout is a depthwise convolution.
	Groups int
}

// dilation and groups are p's Dilation and Groups with 0 read as 1.
func (p Conv2DParams) dilation() int { return max(p.Dilation, 1) }
func (p Conv2DParams) groups() int   { return max(p.Groups, 1) }

// convShape is a validated convolution's geometry.
type convShape struct {
	n, h, w, cin      int
	cout, kh, kw      int
	ho, wo            int
	stride, pad       int
	dil, groups       int  // ≥ 1
	cing, coutg       int  // Cin/G, Cout/G: the channels of one group
	direct            bool // dilation or groups > 1: CUDA runs the direct kernels (convDirect)
	pointwise         bool // 1×1, stride 1, no padding: a plain GEMM (one a group)
	k                 int  // KH·KW·Cin/G, the GEMM's inner dimension (one group's)
	outPerImg, colImg int  // Ho·Wo; Ho·Wo·K (elements of one image's columns, one group's)
}

// gemmViews are o (y or dy, [N,Ho,Wo,Cout]) and wt (w or dw,
// [Cout,KH,KW,Cin]) as the matrices the GEMM formulation takes:
// [N·Ho·Wo, Cout] and [Cout, K] (one group: the CUDA GEMM paths).
func (s *convShape) gemmViews(o, wt *tensor.Tensor) (o2, wt2 *tensor.Tensor, err error) {
	if o2, err = o.View(s.n*s.outPerImg, s.cout); err != nil {
		return nil, nil, err
	}
	wt2, err = wt.View(s.cout, s.k)
	return o2, wt2, err
}

// ConvOutSize is the output length of a convolution along one axis with
// dilation dil (1: none), PyTorch's nn.Conv2d formula:
// ⌊(in + 2·pad − dil·(k−1) − 1)/stride⌋ + 1, 0 when the padded input is
// shorter than the dilated kernel's extent dil·(k−1)+1 (or stride or dil
// is below 1).
func ConvOutSize(in, k, stride, pad, dil int) int {
	ext := dil*(k-1) + 1
	if dil < 1 || stride < 1 || in+2*pad < ext {
		return 0
	}
	return (in+2*pad-ext)/stride + 1
}

func (e *Engine) convGeometry(op string, x, w *tensor.Tensor, p Conv2DParams) (convShape, error) {
	if err := e.checkView(op+" x", x, true, floatTypes); err != nil {
		return convShape{}, err
	}
	if err := e.checkView(op+" w", w, true, []tensor.DType{x.DType}); err != nil {
		return convShape{}, err
	}
	return convShapeOf(op, x.Shape, w.Shape, p)
}

// convShapeOf validates a convolution of x (shape xs) by w (shape ws)
// with p, before any work (Graph.Conv2D checks at recording what the
// engine checks at run time).
func convShapeOf(op string, xs, ws []int, p Conv2DParams) (convShape, error) {
	var s convShape
	if len(xs) != 4 || len(ws) != 4 {
		return s, fmt.Errorf("%w: %s x %v, w %v (want [N,H,W,Cin] and [Cout,KH,KW,Cin/G])", tensor.ErrShape, op, xs, ws)
	}
	if p.Stride < 1 || p.Pad < 0 {
		return s, fmt.Errorf("%w: %s stride %d, padding %d", ErrConfig, op, p.Stride, p.Pad)
	}
	if p.Dilation < 0 || p.Groups < 0 {
		return s, fmt.Errorf("%w: %s dilation %d, groups %d (want ≥ 0; 0 means 1)", ErrConfig, op, p.Dilation, p.Groups)
	}
	s = convShape{n: xs[0], h: xs[1], w: xs[2], cin: xs[3], cout: ws[0], kh: ws[1], kw: ws[2],
		stride: p.Stride, pad: p.Pad, dil: p.dilation(), groups: p.groups()}
	if s.cin < 1 || s.cout < 1 || s.kh < 1 || s.kw < 1 {
		return s, fmt.Errorf("%w: %s x %v, w %v", tensor.ErrShape, op, xs, ws)
	}
	if s.cin%s.groups != 0 || s.cout%s.groups != 0 {
		return s, fmt.Errorf("%w: %s of %d input and %d output channels in %d groups (want a divisor of both)", ErrConfig, op, s.cin, s.cout, s.groups)
	}
	s.cing, s.coutg = s.cin/s.groups, s.cout/s.groups
	if ws[3] != s.cing {
		return s, fmt.Errorf("%w: %s w %v for %d input channels in %d groups (want w [Cout,KH,KW,%d])", tensor.ErrShape, op, ws, s.cin, s.groups, s.cing)
	}
	if eh, ew := s.dil*(s.kh-1)+1, s.dil*(s.kw-1)+1; p.Pad >= eh || p.Pad >= ew {
		return s, fmt.Errorf("%w: %s padding %d with a %d×%d kernel at dilation %d (want pad < the dilated kernel's %d×%d)",
			ErrConfig, op, p.Pad, s.kh, s.kw, s.dil, eh, ew)
	}
	s.ho, s.wo = ConvOutSize(s.h, s.kh, s.stride, s.pad, s.dil), ConvOutSize(s.w, s.kw, s.stride, s.pad, s.dil)
	if s.ho < 1 || s.wo < 1 {
		return s, fmt.Errorf("%w: %s of a %d×%d image with a %d×%d kernel, padding %d, dilation %d", tensor.ErrShape, op, s.h, s.w, s.kh, s.kw, s.pad, s.dil)
	}
	s.direct = s.dil > 1 || s.groups > 1
	s.pointwise = s.kh == 1 && s.kw == 1 && s.stride == 1 && s.pad == 0
	s.k = s.kh * s.kw * s.cing
	s.outPerImg = s.ho * s.wo
	s.colImg = s.outPerImg * s.k
	if int64(s.n)*int64(s.h)*int64(s.w)*int64(max(s.cin, s.cout)) > 1<<31-1 || int64(s.colImg) > 1<<31-1 {
		return s, fmt.Errorf("%w: %s too large for 32-bit indexing (x %v, w %v)", tensor.ErrShape, op, xs, ws)
	}
	return s, nil
}

// Conv2D computes the 2-D cross-correlation of PyTorch's nn.Conv2d with
// channels-last tensors, for stride s, padding p, dilation d and G groups
// (Conv2DParams):
//
//	y[n,i,j,o] = b[o] + Σ_{kh,kw,c<Cin/G} x[n, i·s−p+kh·d, j·s−p+kw·d, g·Cin/G + c]·w[o,kh,kw,c],  g = ⌊o/(Cout/G)⌋
//
// (x taken as 0 outside the image), for x [N,H,W,Cin], w
// [Cout,KH,KW,Cin/G] and y [N,Ho,Wo,Cout] with Ho =
// ConvOutSize(H, KH, s, p, d), all contiguous and of one dtype (f32
// or bf16); b [Cout] of that dtype, or nil. G must divide Cin and Cout;
// padding must be smaller than the dilated kernel, d·(KH−1)+1 (and
// d·(KW−1)+1). Products accumulate in f32 (TF32 under PrecTF32 for f32
// data, as the GEMM family). A 1×1 kernel with stride 1 and no padding is
// one GEMM (a group); on CUDA, bf16 convolutions with Cin a multiple of 32
// run as an implicit GEMM on tensor cores (the columns are gathered into
// shared memory tile by tile, never stored) on mma.sync (conv_igemm_fwd;
// conv2d_wg.cu's wgmma kernels are selectable, see convPath); other
// kernels gather the columns (im2col, K = KH·KW·Cin per output position)
// into scratch memory a few images at a time and multiply them by wᵀ with
// the bias fused. Those fast paths are for d = 1, G = 1 only: on CUDA a
// dilated or grouped convolution runs conv2d.cu's direct kernels
// (convDirectFwd: a correct general path, not tuned), on the host one
// im2col GEMM a group. Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout, exec.ErrDevice or ErrConfig (a stride below 1, a
// negative padding, dilation or groups, groups not dividing Cin and Cout,
// padding not below the dilated kernel; w's last dimension not Cin/G is
// tensor.ErrShape).
func (e *Engine) Conv2D(y, x, w, b *tensor.Tensor, p Conv2DParams) error {
	s, err := e.convGeometry("conv2d", x, w, p)
	if err != nil {
		return err
	}
	if err := e.checkView("conv2d y", y, true, []tensor.DType{x.DType}, s.n, s.ho, s.wo, s.cout); err != nil {
		return err
	}
	if b != nil {
		if err := e.checkView("conv2d b", b, true, []tensor.DType{x.DType}, s.cout); err != nil {
			return err
		}
	}
	if s.n == 0 {
		return nil
	}
	return e.dispatch(func(h *hostImpl) error { return h.conv2d(y, x, w, b, &s) },
		func(c *cudaImpl) error { return c.conv2d(e, y, x, w, b, &s) })
}

// Conv2DBackward computes the gradients of Conv2D from dy [N,Ho,Wo,Cout]
// (of x's dtype), with g = ⌊o/(Cout/G)⌋ the group of output channel o:
//
//	dx[n,h,w,g·Cin/G+c] = Σ_{o in group g, kh,kw: h = i·s−p+kh·d, w = j·s−p+kw·d} dy[n,i,j,o]·w[o,kh,kw,c]
//	dw[o,kh,kw,c] = Σ_{n,i,j} dy[n,i,j,o]·x[n, i·s−p+kh·d, j·s−p+kw·d, g·Cin/G + c]
//	db[o] = Σ_{n,i,j} dy[n,i,j,o]
//
// dx of x's shape and dtype; dw of w's shape, f32 or x's dtype; db [Cout],
// f32 or x's dtype (an f32 master's gradient under bf16 autocast). Any of
// them may be nil (not wanted); acc[0..2] add dx, dw, db to what they hold
// instead of overwriting it. dw is the GEMM dyᵀ·columns over the same
// im2col chunks as the forward (f32 accumulation across chunks when dw
// is f32); dx is the GEMM dy·w into column gradients, which a gather
// (col2im: each dx element sums its ≤ KH·KW terms in a fixed order, no
// atomics) folds back into the image — or, on CUDA in bf16 at stride 1, the
// forward's implicit GEMM on dy with the filters flipped. On the host a
// grouped convolution runs these GEMMs a group at a time; on CUDA a
// dilated or grouped one runs conv2d.cu's direct kernels
// (convDirectBackward), every element summing its terms in a fixed order.
// Errors as Conv2D.
func (e *Engine) Conv2DBackward(dx, dw, db, dy, x, w *tensor.Tensor, p Conv2DParams, acc [3]bool) error {
	s, err := e.convGeometry("conv2d backward", x, w, p)
	if err != nil {
		return err
	}
	if err := e.checkView("conv2d backward dy", dy, true, []tensor.DType{x.DType}, s.n, s.ho, s.wo, s.cout); err != nil {
		return err
	}
	if dx != nil {
		if err := e.checkView("conv2d backward dx", dx, true, []tensor.DType{x.DType}, x.Shape...); err != nil {
			return err
		}
	}
	if dw != nil {
		if err := e.checkView("conv2d backward dw", dw, true, []tensor.DType{tensor.F32, x.DType}, w.Shape...); err != nil {
			return err
		}
	}
	if db != nil {
		if err := e.checkView("conv2d backward db", db, true, []tensor.DType{tensor.F32, x.DType}, s.cout); err != nil {
			return err
		}
	}
	if s.n == 0 {
		for i, t := range []*tensor.Tensor{dw, db} {
			if t != nil && !acc[i+1] {
				if err := e.Zero(t); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if db != nil {
		dy3, err := dy.View(1, s.n*s.outPerImg, s.cout)
		if err != nil {
			return err
		}
		db2, err := db.View(1, s.cout)
		if err != nil {
			return err
		}
		if err := e.SpatialSum(db2, dy3, acc[2]); err != nil {
			return err
		}
	}
	if dx == nil && dw == nil {
		return nil
	}
	return e.dispatch(func(h *hostImpl) error { return h.conv2dBackward(dx, dw, dy, x, w, &s, acc) },
		func(c *cudaImpl) error { return c.conv2dBackward(e, dx, dw, dy, x, w, &s, acc) })
}

// Zero sets a contiguous float tensor (f32 or bf16) to zero.
func (e *Engine) Zero(t *tensor.Tensor) error {
	if t.DType == tensor.F32 {
		return e.Fill(t, 0)
	}
	if err := e.checkView("zero", t, true, floatTypes); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error { return t.WriteFloat32(make([]float32, t.Numel())) },
		func(c *cudaImpl) error { return c.zero(t) })
}

// convColBytes bounds the im2col scratch (columns, or their gradient) of
// one chunk of images.
const convColBytes = 256 << 20

// convChunk is the number of images whose columns fit in convColBytes (at
// least one).
func convChunk(s *convShape, elt int) int {
	per := int64(s.colImg) * int64(elt)
	return int(max(1, min(int64(s.n), convColBytes/max(per, 1))))
}

// ---- host ----

// hostIm2col writes the columns of images [n0, n0+nc) of x (row-major f32
// [N,H,W,Cin]) for the group whose input channels start at c0 into col
// [nc·Ho·Wo, K], K = KH·KW·Cin/G ordered (kh, kw, c): the taps of output
// (oh, ow) read rows oh·s − p + kh·d, columns ow·s − p + kw·d.
func hostIm2col(col, x []float32, s *convShape, n0, nc, c0 int) {
	C := s.cing
	i := 0
	for n := n0; n < n0+nc; n++ {
		for oh := 0; oh < s.ho; oh++ {
			for ow := 0; ow < s.wo; ow++ {
				for kh := 0; kh < s.kh; kh++ {
					h := oh*s.stride - s.pad + kh*s.dil
					for kw := 0; kw < s.kw; kw++ {
						w := ow*s.stride - s.pad + kw*s.dil
						dst := col[i : i+C]
						i += C
						if h < 0 || h >= s.h || w < 0 || w >= s.w {
							clear(dst)
							continue
						}
						copy(dst, x[((n*s.h+h)*s.w+w)*s.cin+c0:])
					}
				}
			}
		}
	}
}

// hostCol2im adds the column gradients dcol of images [n0, n0+nc) of the
// group whose input channels start at c0 (hostIm2col's layout) into dx
// (row-major f32 [N,H,W,Cin], already holding what it must be added to).
func hostCol2im(dx, dcol []float32, s *convShape, n0, nc, c0 int) {
	C := s.cing
	i := 0
	for n := n0; n < n0+nc; n++ {
		for oh := 0; oh < s.ho; oh++ {
			for ow := 0; ow < s.wo; ow++ {
				for kh := 0; kh < s.kh; kh++ {
					h := oh*s.stride - s.pad + kh*s.dil
					for kw := 0; kw < s.kw; kw++ {
						w := ow*s.stride - s.pad + kw*s.dil
						src := dcol[i : i+C]
						i += C
						if h < 0 || h >= s.h || w < 0 || w >= s.w {
							continue
						}
						dst := dx[((n*s.h+h)*s.w+w)*s.cin+c0:]
						for c, v := range src {
							dst[c] += v
						}
					}
				}
			}
		}
	}
}

// The host runs a convolution of G groups as G GEMMs over each chunk of
// images: group g's columns are the (kh, kw, c ∈ group g) gather ([rows,
// K], K = KH·KW·Cin/G; a pointwise convolution reads x's group-g columns
// in place, leading dimension Cin), its filters rows g·Cout/G.. of w
// viewed [Cout, K], its outputs y's columns g·Cout/G.. (leading dimension
// Cout). At G = 1 that is one GEMM of the whole convolution.

// hostGroupCols is group g's GEMM operand for images [n0, n0+m) of xs and
// its leading dimension: a pointwise convolution reads x's group-g
// channels in place (Cin), any other gathers them into col (hostIm2col,
// K).
func hostGroupCols(col, xs []float32, s *convShape, n0, m, g int) ([]float32, int) {
	if s.pointwise {
		return xs[n0*s.outPerImg*s.cin+g*s.cing:], s.cin
	}
	hostIm2col(col, xs, s, n0, m, g*s.cing)
	return col, s.k
}

func (h *hostImpl) conv2d(y, x, w, b *tensor.Tensor, s *convShape) error {
	ins, err := hostIns(x, w, b)
	if err != nil {
		return err
	}
	xs, ws, bs := ins[0], ins[1], ins[2]
	ys, commit, err := hostOut(y, false)
	if err != nil {
		return err
	}
	nc := convChunk(s, 4)
	var col []float32
	if !s.pointwise {
		col = make([]float32, nc*s.colImg)
	}
	for n0 := 0; n0 < s.n; n0 += nc {
		m := min(nc, s.n-n0)
		rows := m * s.outPerImg
		out := ys[n0*s.outPerImg*s.cout : (n0+m)*s.outPerImg*s.cout]
		for g := 0; g < s.groups; g++ {
			a, lda := hostGroupCols(col, xs, s, n0, m, g)
			h.blas.Sgemm(blas.NoTrans, blas.Trans, rows, s.coutg, s.k, 1, a, lda, ws[g*s.coutg*s.k:], s.k, 0, out[g*s.coutg:], s.cout)
		}
		if bs != nil {
			for r := 0; r < rows; r++ {
				row := out[r*s.cout : (r+1)*s.cout]
				for o := range row {
					row[o] += bs[o]
				}
			}
		}
	}
	return commit()
}

func (h *hostImpl) conv2dBackward(dx, dw, dy, x, w *tensor.Tensor, s *convShape, acc [3]bool) error {
	gs, err := hostIn(dy)
	if err != nil {
		return err
	}
	if dw != nil {
		xs, err := hostIn(x)
		if err != nil {
			return err
		}
		dws, commit, err := hostOut(dw, acc[1])
		if err != nil {
			return err
		}
		nc := convChunk(s, 4)
		var col []float32
		if !s.pointwise {
			col = make([]float32, nc*s.colImg)
		}
		for n0 := 0; n0 < s.n; n0 += nc {
			m := min(nc, s.n-n0)
			beta := float32(1)
			if n0 == 0 {
				beta = 0
			}
			for g := 0; g < s.groups; g++ {
				a, lda := hostGroupCols(col, xs, s, n0, m, g)
				// dw_g[Cout/G, K] (+)= dy_gᵀ[Cout/G, rows]·col_g[rows, K]
				h.blas.Sgemm(blas.Trans, blas.NoTrans, s.coutg, s.k, m*s.outPerImg, 1, gs[n0*s.outPerImg*s.cout+g*s.coutg:], s.cout,
					a, lda, beta, dws[g*s.coutg*s.k:], s.k)
			}
		}
		if err := commit(); err != nil {
			return err
		}
	}
	if dx == nil {
		return nil
	}
	ws, err := hostIn(w)
	if err != nil {
		return err
	}
	dxs, commit, err := hostOut(dx, acc[0])
	if err != nil {
		return err
	}
	if s.pointwise {
		// dx_g[rows, Cin/G] = dy_g[rows, Cout/G]·w_g[Cout/G, Cin/G]
		for g := 0; g < s.groups; g++ {
			h.blas.Sgemm(blas.NoTrans, blas.NoTrans, s.n*s.outPerImg, s.cing, s.coutg, 1, gs[g*s.coutg:], s.cout,
				ws[g*s.coutg*s.cing:], s.cing, 0, dxs[g*s.cing:], s.cin)
		}
		return commit()
	}
	clear(dxs)
	nc := convChunk(s, 4)
	dcol := make([]float32, nc*s.colImg)
	for n0 := 0; n0 < s.n; n0 += nc {
		m := min(nc, s.n-n0)
		for g := 0; g < s.groups; g++ {
			h.blas.Sgemm(blas.NoTrans, blas.NoTrans, m*s.outPerImg, s.k, s.coutg, 1, gs[n0*s.outPerImg*s.cout+g*s.coutg:], s.cout,
				ws[g*s.coutg*s.k:], s.k, 0, dcol, s.k)
			hostCol2im(dxs, dcol, s, n0, m, g*s.cing)
		}
	}
	return commit()
}

// ---- CUDA ----

// convVec is the elements per 16-byte vector of dt.
func convVec(dt tensor.DType) int { return 16 / dt.Size() }

// scratchTensor wraps n elements of the scratch slot name as a contiguous
// tensor of dtype dt and shape (valid until the slot grows: within one op).
func (c *cudaImpl) scratchTensor(e *Engine, name string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	n := int64(tensor.Numel(shape)) * int64(dt.Size())
	p, err := c.Scratch(name, n)
	if err != nil {
		return nil, err
	}
	return tensor.New(device.NewBuffer(e.Device(), uintptr(p), n, nil, device.Shareable{FD: -1}, nil), dt, shape...)
}

// convPath chooses the kernels of bf16 convolutions on CUDA (tests and
// benchmarks compare them: SetConvPath, SetConvImplicit). convMMA runs a
// shape conv_igemm_fwd takes (igemmOK) as that implicit GEMM on mma.sync,
// else im2col + cuBLASLt; at stride 1 the input gradient runs the same
// kernel on the flipped filters. convWG, the default, runs the shapes
// conv2d_wg.cu's kernels take (wgOK: sm_90a) on wgmma instead, and the rest
// as convMMA (on an H200, 2026-11-28, bench/conv.sh: wgmma's forward
// 1.4–2.3× mma.sync's at every U-Net shape measured; the guided sampling
// step at batch 256 6.31 ms against 8.50). convIm2col runs every shape as
// im2col + cuBLASLt. The backward's kernels are convBwdPath's choice.
// GPUKIT_CONV_PATH=mma|wg|im2col sets it for a process (a benchmark of a
// whole tool); another value leaves the default.
var convPath = convPathFromEnv(os.Getenv("GPUKIT_CONV_PATH"))

// convWS runs the wgmma kernels warp-specialised — the forward (and the
// input gradient, which is a forward), conv_wg_fwd_ws_<BN>, and the weight
// gradient, conv_wg_dw_ws_<BN>: a producer warpgroup copying into the
// stage ring and two consumer warpgroups on mbarriers, no block barrier
// (conv2d_wg.cu's cw_mainloop_ws). Not the default: on an H200
// (2026-11-29, bench/conv.sh) it was slower than the wgmma kernels at
// every shape of the conv table (forward 0.58–1.0×, backward 0.67–0.92×
// their TFLOP/s): its 128 producer threads compute every gathered row's
// address and issue every cp.async, where the wgmma kernels spread that
// over 256; TMA's im2col loads (one thread per stage) are what would
// free them. GPUKIT_CONV_WS=1 turns it on for a process.
var convWS = os.Getenv("GPUKIT_CONV_WS") == "1"

// convTMA runs the wgmma forward (and the input gradient, a forward) with
// TMA loads — conv_wg_fwd_tma_<BN>: cw_mainloop_ws with one producer
// thread issuing each k-step's two copies, the A tile gathered by an
// im2col tensor map and the filter tile by a tiled one, encoded for each
// launch (convTMAArgs) — where wgOK holds, no fused input map is asked for,
// the stride is at most 8 (TMA's traversal strides) and the padding at
// most 127 (a 4-D im2col map's bounding-box corners are 8-bit). On an H200
// (2026-11-29, BENCHMARKS.md) its forward ran at 1.40–1.94× the wgmma
// kernel's TFLOP/s and 0.72–1.16× cuDNN's. The default;
// GPUKIT_CONV_TMA=0 turns it off for a process.
var convTMA = os.Getenv("GPUKIT_CONV_TMA") != "0"

// convBwdPath chooses the kernels of the backward (input and weight
// gradients) as convPath does the forward's. By default it is convWG
// (which runs mma.sync and im2col where wgOK does not hold): on an H200
// (2026-11-29, BenchmarkConv2D) once conv_wg_dw stepped its rows instead
// of dividing per copy (5531490), the wgmma backward took 7.73 ms in sum
// over the eight U-Net shapes against mma.sync's 9.47 — ahead at seven,
// 7% behind at 16×64²×320. (Before that, 2026-11-28: 10.39 against 9.50,
// and mma.sync was the default.) GPUKIT_CONV_BWD=mma|wg|im2col sets it;
// with GPUKIT_CONV_PATH set and GPUKIT_CONV_BWD not, it follows
// GPUKIT_CONV_PATH.
var convBwdPath = convBwdPathFromEnv(os.Getenv("GPUKIT_CONV_PATH"), os.Getenv("GPUKIT_CONV_BWD"))

// convBwdPathFromEnv is convBwdPath for GPUKIT_CONV_PATH's and
// GPUKIT_CONV_BWD's values.
func convBwdPathFromEnv(path, bwd string) int {
	switch {
	case bwd == "mma" || bwd == "wg" || bwd == "im2col":
		return convPathFromEnv(bwd)
	case path == "mma" || path == "wg" || path == "im2col":
		return convPathFromEnv(path)
	}
	return convWG
}

// convPathFromEnv is convPath for the value of GPUKIT_CONV_PATH.
func convPathFromEnv(v string) int {
	switch v {
	case "mma":
		return convMMA
	case "im2col":
		return convIm2col
	}
	return convWG
}

// The values of convPath.
const (
	convMMA = iota
	convWG
	convIm2col
)

// aligned16 reports whether every present tensor starts 16-byte aligned.
func aligned16(ts ...*tensor.Tensor) bool {
	for _, t := range ts {
		if t != nil && devPtr(t)%16 != 0 {
			return false
		}
	}
	return true
}

// igemmOK reports whether path runs y = conv(x, w) + b as an implicit GEMM
// (conv_igemm_fwd, or conv_wg_fwd where wgOK): not im2col, bf16,
// Cin a multiple of 32 (a K chunk stays within one tap; filter rows of
// 16-byte multiples), 16-byte aligned tensors.
func igemmOK(path, cin, cout int, ts ...*tensor.Tensor) bool {
	return path != convIm2col && ts[0].DType == tensor.BF16 && cin%32 == 0 && cout >= 1 && aligned16(ts...)
}

// wgOK reports whether path runs a shape igemmOK takes on wgmma: path is
// convWG, the wgmma kernels exist (convHopper), Cin is a multiple of 64 (a k-step of
// 64 channels stays within one tap) and Cout of 8 (bf16 pairs in the
// epilogue).
func (c *cudaImpl) wgOK(path, cin, cout int) bool {
	return path == convWG && cin%64 == 0 && cout%8 == 0 && c.convHopper()
}

// convHopperState caches whether conv2d_wg.cu was compiled with its wgmma
// kernels (sm_90a).
type convHopperState struct{ wgModule }

// convHopper reports whether conv2d_wg.cu's kernels exist: the module was
// built for sm_90a and lacks the conv_wg_unavailable marker
// (wgModule.has). Decided once per engine.
func (c *cudaImpl) convHopper() bool {
	return exec.StateOf[convHopperState](c.CUDA).has(c, launch.ConvWgUnavailableKernel)
}

// convIgemm launches the implicit GEMM y (+)= conv(x, w) + bias over n
// images of h×w×cin into ho×wo×cout (igemmOK holds for path):
// conv_wg_fwd_<BN> (256 threads, 128 pixels × BN channels a block, 4
// stages; conv_wg_fwd_ws_<BN>, 384 threads, with convWS) where wgOK
// holds, BN = 256 when Cout is a multiple of 256 and that still gives
// every multiprocessor two blocks, else 128 above 64 channels, else 64;
// conv_igemm_fwd (128 threads, 128 × 64) otherwise. The tile choice is a
// rule, not yet timed per shape.
func (c *cudaImpl) convIgemm(path int, x, w, bias, y *tensor.Tensor, n, h, wd, cin, ho, wo, cout, kh, kw, stride, pad int, acc bool) error {
	a := launch.ConvIgemmArgs{X: devPtr(x), W: devPtr(w), Y: devPtr(y), N: int32(n), H: int32(h), W_: int32(wd), Cin: int32(cin),
		Ho: int32(ho), Wo: int32(wo), Cout: int32(cout), Kh: int32(kh), Kw: int32(kw), Stride: int32(stride), Pad: int32(pad)}
	if bias != nil {
		a.Bias = devPtr(bias)
	}
	if acc {
		a.Acc = 1
	}
	return c.convIgemmLaunch(path, &a)
}

// convIgemmLaunch launches the implicit GEMM of convIgemm for arguments a
// (fused terms included: Conv2DFused).
func (c *cudaImpl) convIgemmLaunch(path int, a *launch.ConvIgemmArgs) error {
	cin, cout := int(a.Cin), int(a.Cout)
	rows := int64(a.N) * int64(a.Ho) * int64(a.Wo)
	rowBlocks := uint32((rows + 127) / 128)
	if c.wgOK(path, cin, cout) {
		const stages = 4
		bn := int64(64)
		switch {
		case cout%256 == 0 && int64(rowBlocks)*int64(cout/256) >= 2*int64(c.SMCount()):
			bn = 256
		case cout > 64:
			bn = 128
		}
		grid := [3]uint32{rowBlocks, uint32((int64(cout) + bn - 1) / bn), 1}
		smem := uint32(stages*(128+bn)*128 + 1024)
		f, fws := launch.ConvWgFwd64, launch.ConvWgFwdWs64
		switch bn {
		case 256:
			f, fws = launch.ConvWgFwd256, launch.ConvWgFwdWs256
		case 128:
			f, fws = launch.ConvWgFwd128, launch.ConvWgFwdWs128
		}
		if convTMA && a.ProScale == 0 && a.Stride <= 8 && a.Pad <= 127 { // TMA's traversal strides and 4-D im2col corners
			t, err := convTMAArgs(a, bn)
			if err != nil {
				return err
			}
			f := launch.ConvWgFwdTma64
			switch bn {
			case 256:
				f = launch.ConvWgFwdTma256
			case 128:
				f = launch.ConvWgFwdTma128
			}
			return f(c, grid, block1(384), smem+128, t) // + its 2·stages mbarriers
		}
		if convWS {
			return fws(c, grid, block1(384), smem+128, a) // + its 2·stages mbarriers
		}
		return f(c, grid, block1(256), smem, a)
	}
	grid := [3]uint32{rowBlocks, uint32((cout + 63) / 64), 1}
	return launch.ConvIgemmFwd(c, grid, block1(128), 2*(128+64)*40*2, a)
}

// convTMAArgs are conv_wg_fwd_tma_<bn>'s arguments for a: x's im2col
// tensor map (NHWC as {Cin, W, H, N}; 64 channels × 128 output pixels a
// copy; traversal strides the convolution's; bounding box of the filter's
// top-left tap from −pad to pad − (K − 1) past the image's last row and
// column) and w's tiled map (as [Cout, KH·KW·Cin], boxes of 64 × bn), both
// 128-byte swizzled as the kernel's shared tiles are (cw_swz).
func convTMAArgs(a *launch.ConvIgemmArgs, bn int64) (*launch.ConvTmaArgs, error) {
	t := &launch.ConvTmaArgs{A: *a}
	cin, w, h, n := uint64(a.Cin), uint64(a.W_), uint64(a.H), uint64(a.N)
	var m cuda.TensorMap
	if err := cuda.EncodeIm2col(&m, cuda.TensorMapBF16, a.X, []uint64{cin, w, h, n}, []uint64{2 * cin, 2 * cin * w, 2 * cin * w * h},
		[]int32{-a.Pad, -a.Pad}, []int32{a.Pad - (a.Kw - 1), a.Pad - (a.Kh - 1)}, 64, 128,
		[]uint32{1, uint32(a.Stride), uint32(a.Stride), 1}, cuda.TensorMapSwizzle128); err != nil {
		return nil, fmt.Errorf("the im2col tensor map of x [%d,%d,%d,%d]: %w", n, h, w, cin, err)
	}
	t.Tx = launch.GpukitTmap{V: m}
	k := uint64(a.Kh) * uint64(a.Kw) * cin
	if err := cuda.EncodeTiled(&m, cuda.TensorMapBF16, a.W, []uint64{k, uint64(a.Cout)}, []uint64{2 * k},
		[]uint32{64, uint32(bn)}, cuda.TensorMapSwizzle128); err != nil {
		return nil, fmt.Errorf("the tensor map of w [%d,%d]: %w", a.Cout, k, err)
	}
	t.Tw = launch.GpukitTmap{V: m}
	return t, nil
}

// convTMADWArgs are conv_wg_dw_tma_<BN>'s arguments for a (dy [P, Cout]
// and x [N, H, W, Cin] bf16, dense): dy's tiled map (boxes of 64 channels
// × 64 pixels) and x's im2col map as convTMAArgs' but 64 pixels a copy.
func convTMADWArgs(a *launch.ConvWgDwArgs, dy, x *tensor.Tensor) (*launch.ConvTmaDwArgs, error) {
	t := &launch.ConvTmaDwArgs{A: *a}
	pixels := uint64(a.N) * uint64(a.Ho) * uint64(a.Wo)
	var m cuda.TensorMap
	if err := cuda.EncodeTiled(&m, cuda.TensorMapBF16, devPtr(dy), []uint64{uint64(a.Cout), pixels}, []uint64{2 * uint64(a.Cout)},
		[]uint32{64, 64}, cuda.TensorMapSwizzle128); err != nil {
		return nil, fmt.Errorf("the tensor map of dy %v: %w", dy.Shape, err)
	}
	t.Tdy = launch.GpukitTmap{V: m}
	cin, w, h, n := uint64(a.Cin), uint64(a.W_), uint64(a.H), uint64(a.N)
	if err := cuda.EncodeIm2col(&m, cuda.TensorMapBF16, devPtr(x), []uint64{cin, w, h, n}, []uint64{2 * cin, 2 * cin * w, 2 * cin * w * h},
		[]int32{-a.Pad, -a.Pad}, []int32{a.Pad - (a.Kw - 1), a.Pad - (a.Kh - 1)}, 64, 64,
		[]uint32{1, uint32(a.Stride), uint32(a.Stride), 1}, cuda.TensorMapSwizzle128); err != nil {
		return nil, fmt.Errorf("the im2col tensor map of x %v: %w", x.Shape, err)
	}
	t.Tx = launch.GpukitTmap{V: m}
	return t, nil
}

// convWgDW computes dw (+)= the weight gradient (f32 [Cout, KH·KW·Cin])
// with conv_wg_dw_<BN> (BN = 128 when Cin is a multiple of 128, else 64;
// conv_wg_dw_tma_<BN> with convTMA, conv_wg_dw_ws_<BN> with convWS)
// over splits of the output pixels, enough for two blocks a
// multiprocessor, then conv_dw_reduce adds the splits' partial sums in
// order into dw (one split not accumulating writes dw directly).
func (c *cudaImpl) convWgDW(e *Engine, dw, dy, x *tensor.Tensor, s *convShape, acc bool) error {
	bn := 64
	if s.cin%128 == 0 {
		bn = 128
	}
	pixels := int64(s.n) * int64(s.ho) * int64(s.wo)
	tiles := int64((s.cout+127)/128) * int64(s.k/bn)
	steps := (pixels + 63) / 64
	splits := min(steps, max(1, (2*int64(c.SMCount())+tiles-1)/tiles))
	chunk := (steps + splits - 1) / splits * 64
	splits = (pixels + chunk - 1) / chunk
	a := launch.ConvWgDwArgs{X: devPtr(x), Dy: devPtr(dy), N: int32(s.n), H: int32(s.h), W_: int32(s.w), Cin: int32(s.cin),
		Ho: int32(s.ho), Wo: int32(s.wo), Cout: int32(s.cout), Kh: int32(s.kh), Kw: int32(s.kw), Stride: int32(s.stride),
		Pad: int32(s.pad), Chunk: int32(chunk)}
	n := int64(s.cout) * int64(s.k)
	direct := splits == 1 && !acc && devPtr(dw)%8 == 0 // the epilogue stores float2
	if direct {
		a.Part = devPtr(dw)
	} else {
		part, err := c.Scratch("conv2d.dwpart", splits*n*4)
		if err != nil {
			return err
		}
		a.Part = part
	}
	grid := [3]uint32{uint32((s.cout + 127) / 128), uint32(s.k / bn), uint32(splits)}
	smem := uint32(4*(128+bn)*128 + 1024)
	var err error
	switch {
	case convTMA && s.stride <= 8 && s.pad <= 127 && pixels < 1<<31: // as convIgemmLaunch's; the tiled map's pixel coordinate is 32-bit
		var t *launch.ConvTmaDwArgs
		if t, err = convTMADWArgs(&a, dy, x); err != nil {
			return err
		}
		if bn == 128 {
			err = launch.ConvWgDwTma128(c, grid, block1(384), smem+128, t) // + its 2·stages mbarriers
		} else {
			err = launch.ConvWgDwTma64(c, grid, block1(384), smem+128, t)
		}
	case convWS && bn == 128:
		err = launch.ConvWgDwWs128(c, grid, block1(384), smem+128, &a) // + its 2·stages mbarriers
	case convWS:
		err = launch.ConvWgDwWs64(c, grid, block1(384), smem+128, &a)
	case bn == 128:
		err = launch.ConvWgDw128(c, grid, block1(256), smem, &a)
	default:
		err = launch.ConvWgDw64(c, grid, block1(256), smem, &a)
	}
	if err != nil || direct {
		return err
	}
	accFlag := int32(0)
	if acc {
		accFlag = 1
	}
	return launch.ConvDwReduce(c, gridFor(n, 256), block1(256), 0, devPtr(dw), a.Part, n, int32(splits), accFlag)
}

func (c *cudaImpl) conv2d(e *Engine, y, x, w, b *tensor.Tensor, s *convShape) error {
	if s.direct {
		return c.convDirectFwd(y, x, w, b, s)
	}
	path, err := c.convFwdPath(e, y, x, w, b, s)
	if err != nil {
		return err
	}
	return c.conv2dOn(e, path, y, x, w, b, s)
}

// conv2dOn runs the forward on path (one of convFwdCandidates).
func (c *cudaImpl) conv2dOn(e *Engine, path int, y, x, w, b *tensor.Tensor, s *convShape) error {
	if !s.pointwise && igemmOK(path, s.cin, s.cout, x, w, y, b) {
		return c.convIgemm(path, x, w, b, y, s.n, s.h, s.w, s.cin, s.ho, s.wo, s.cout, s.kh, s.kw, s.stride, s.pad, false)
	}
	y2, w2, err := s.gemmViews(y, w)
	if err != nil {
		return err
	}
	if s.pointwise {
		x2, err := x.View(s.n*s.outPerImg, s.cin)
		if err != nil {
			return err
		}
		return e.Matmul(Matmul{A: x2, B: w2, D: y2, TransB: true, Bias: b})
	}
	return c.im2colChunks(e, x, s, func(r0, r1 int, col *tensor.Tensor) error {
		d, err := y2.Rows(r0, r1)
		if err != nil {
			return err
		}
		return e.Matmul(Matmul{A: col, B: w2, D: d, TransB: true, Bias: b})
	})
}

// im2colChunks runs f over the im2col columns of x for s a chunk of
// images at a time (convChunk), in a scratch tensor: f gets the output
// rows [r0, r1) the chunk covers and its columns, [r1−r0, s.k].
func (c *cudaImpl) im2colChunks(e *Engine, x *tensor.Tensor, s *convShape, f func(r0, r1 int, col *tensor.Tensor) error) error {
	nc := convChunk(s, x.DType.Size())
	col, err := c.scratchTensor(e, "conv2d.col", x.DType, nc*s.outPerImg, s.k)
	if err != nil {
		return err
	}
	for n0 := 0; n0 < s.n; n0 += nc {
		m := min(nc, s.n-n0)
		rows := m * s.outPerImg
		if err := c.im2col(col, x, s, n0, m); err != nil {
			return err
		}
		cm, err := col.Rows(0, rows)
		if err != nil {
			return err
		}
		if err := f(n0*s.outPerImg, n0*s.outPerImg+rows, cm); err != nil {
			return err
		}
	}
	return nil
}

func (c *cudaImpl) conv2dBackward(e *Engine, dx, dw, dy, x, w *tensor.Tensor, s *convShape, acc [3]bool) error {
	if s.direct {
		return c.convDirectBackward(dx, dw, dy, x, w, s, acc)
	}
	if s.pointwise {
		rowsAll := s.n * s.outPerImg
		dy2, w2, err := s.gemmViews(dy, w)
		if err != nil {
			return err
		}
		x2, err := x.View(rowsAll, s.cin)
		if err != nil {
			return err
		}
		if dw != nil {
			dw2, err := dw.View(s.cout, s.k)
			if err != nil {
				return err
			}
			if err := e.Matmul(Matmul{A: dy2, B: x2, D: dw2, TransA: true, Accumulate: acc[1]}); err != nil {
				return err
			}
		}
		if dx != nil {
			dx2, err := dx.View(rowsAll, s.cin)
			if err != nil {
				return err
			}
			return e.Matmul(Matmul{A: dy2, B: w2, D: dx2, Accumulate: acc[0]})
		}
		return nil
	}
	if dw != nil {
		p, err := c.convTunedPath(func() string { return c.convTuneKey(x.DType, s, "bwd-dw", convBwdPath) }, c.convDWCandidates(dw, dy, x, s), !acc[1],
			func(p int) error { return c.convBwdDW(e, p, dw, dy, x, s, false) })
		if err != nil {
			return err
		}
		if err := c.convBwdDW(e, p, dw, dy, x, s, acc[1]); err != nil {
			return err
		}
	}
	if dx == nil {
		return nil
	}
	p, err := c.convTunedPath(func() string { return c.convTuneKey(x.DType, s, "bwd-dx", convBwdPath) }, c.convDXCandidates(dx, dy, w, s), !acc[0],
		func(p int) error { return c.convBwdDX(e, p, dx, dy, w, s, false) })
	if err != nil {
		return err
	}
	return c.convBwdDX(e, p, dx, dy, w, s, acc[0])
}

// convDWCandidates lists the paths of the weight gradient of s under
// convBwdPath, its own choice first: conv_wg_dw (wgmma, into an f32 dw)
// where wgOK, and the GEMM dyᵀ·columns over im2col chunks (every shape).
func (c *cudaImpl) convDWCandidates(dw, dy, x *tensor.Tensor, s *convShape) []int {
	if dw.DType == tensor.F32 && igemmOK(convBwdPath, s.cin, s.cout, x, dy) && c.wgOK(convBwdPath, s.cin, s.cout) {
		return []int{convWG, convIm2col}
	}
	return []int{convIm2col}
}

// convBwdDW writes (acc: adds) the weight gradient of s into dw on path p
// (one of convDWCandidates).
func (c *cudaImpl) convBwdDW(e *Engine, p int, dw, dy, x *tensor.Tensor, s *convShape, acc bool) error {
	if p == convWG {
		return c.convWgDW(e, dw, dy, x, s, acc)
	}
	dy2, dw2, err := s.gemmViews(dy, dw)
	if err != nil {
		return err
	}
	return c.im2colChunks(e, x, s, func(r0, r1 int, col *tensor.Tensor) error {
		a, err := dy2.Rows(r0, r1)
		if err != nil {
			return err
		}
		return e.Matmul(Matmul{A: a, B: col, D: dw2, TransA: true, Accumulate: acc || r0 > 0})
	})
}

// convDXCandidates lists the paths of the input gradient of s under
// convBwdPath, its own choice first: at stride 1 with square filters the
// forward's implicit GEMM on dy and the flipped filters, on wgmma where
// wgOK and on mma.sync; and the GEMM dy·w into column gradients folded
// back by col2im (every shape).
func (c *cudaImpl) convDXCandidates(dx, dy, w *tensor.Tensor, s *convShape) []int {
	if s.stride != 1 || s.kh != s.kw || !igemmOK(convBwdPath, s.cout, s.cin, dy, w, dx) {
		return []int{convIm2col}
	}
	var ps []int
	if c.wgOK(convBwdPath, s.cout, s.cin) {
		ps = append(ps, convWG)
	}
	return append(ps, convMMA, convIm2col)
}

// convBwdDX writes (acc: adds) the input gradient of s into dx on path p
// (one of convDXCandidates).
func (c *cudaImpl) convBwdDX(e *Engine, p int, dx, dy, w *tensor.Tensor, s *convShape, acc bool) error {
	if p != convIm2col {
		// dx = conv(dy, flip(w)) with padding KH−1−pad: the forward kernel
		// on the filters rotated by 180° with in and out channels swapped.
		wf, err := c.scratchTensor(e, "conv2d.wflip", w.DType, s.cin, s.kh, s.kw, s.cout)
		if err != nil {
			return err
		}
		if err := launch.ConvFlipW(c, gridFor(int64(w.Numel()), 256), block1(256), 0,
			devPtr(wf), devPtr(w), int32(s.cout), int32(s.kh), int32(s.kw), int32(s.cin)); err != nil {
			return err
		}
		return c.convIgemm(p, dy, wf, nil, dx, s.n, s.ho, s.wo, s.cout, s.h, s.w, s.cin, s.kh, s.kw, 1, s.kh-1-s.pad, acc)
	}
	dy2, w2, err := s.gemmViews(dy, w)
	if err != nil {
		return err
	}
	nc := convChunk(s, dy.DType.Size())
	dcol, err := c.scratchTensor(e, "conv2d.dcol", dy.DType, nc*s.outPerImg, s.k)
	if err != nil {
		return err
	}
	for n0 := 0; n0 < s.n; n0 += nc {
		m := min(nc, s.n-n0)
		rows := m * s.outPerImg
		a, err := dy2.Rows(n0*s.outPerImg, n0*s.outPerImg+rows)
		if err != nil {
			return err
		}
		d, err := dcol.Rows(0, rows)
		if err != nil {
			return err
		}
		if err := e.Matmul(Matmul{A: a, B: w2, D: d}); err != nil {
			return err
		}
		if err := c.col2im(dx, dcol, s, n0, m, acc); err != nil {
			return err
		}
	}
	return nil
}

func newConvArgs(s *convShape, n0, nc int, acc bool) launch.ConvArgs {
	a := launch.ConvArgs{N0: int32(n0), Nc: int32(nc), H: int32(s.h), W: int32(s.w), C: int32(s.cin),
		Kh: int32(s.kh), Kw: int32(s.kw), Ho: int32(s.ho), Wo: int32(s.wo), Stride: int32(s.stride), Pad: int32(s.pad)}
	if acc {
		a.Acc = 1
	}
	return a
}

// im2col launches conv_im2col_<s|v>_<dt> over the columns of images
// [n0, n0+nc): 16-byte vectors of channels when Cin and both pointers
// allow.
func (c *cudaImpl) im2col(col, x *tensor.Tensor, s *convShape, n0, nc int) error {
	v := convVec(x.DType)
	inst := "s"
	if s.cin%v == 0 && devPtr(x)%16 == 0 && devPtr(col)%16 == 0 {
		inst = "v"
	} else {
		v = 1
	}
	a := newConvArgs(s, n0, nc, false)
	n := int64(nc) * int64(s.colImg) / int64(v)
	kernel := launch.ConvIm2colS
	if inst == "v" {
		kernel = launch.ConvIm2colV
	}
	return kernel(c, dtName(x.DType), gridFor(n, 256), block1(256), 0, devPtr(col), devPtr(x), &a)
}

// col2im launches conv_col2im_<dt> over the elements of images [n0, n0+nc)
// of dx.
func (c *cudaImpl) col2im(dx, dcol *tensor.Tensor, s *convShape, n0, nc int, acc bool) error {
	a := newConvArgs(s, n0, nc, acc)
	n := int64(nc) * int64(s.h) * int64(s.w) * int64(s.cin)
	return launch.ConvCol2im(c, dtName(dx.DType), gridFor(n, 256), block1(256), 0, devPtr(dx), devPtr(dcol), &a)
}

// The direct kernels (conv2d.cu's conv_direct_*) run every convolution
// with a dilation or groups above 1 (convShape.direct) on CUDA: a correct
// general path, not a tuned one — no tensor cores, no shared-memory
// tiles; the fast paths above (implicit GEMM, im2col + cuBLASLt, the
// pointwise GEMM, the flipped-filter input gradient, the tuned choice)
// are for d = 1, G = 1. Every output element sums its terms in f32 in a
// fixed order (deterministic, no atomics), so f32 data is computed in
// full f32 whatever the engine's precision, and bf16 rounds once.

// newConvDirectArgs is conv_direct_args for s.
func newConvDirectArgs(s *convShape, acc bool) launch.ConvDirectArgs {
	a := launch.ConvDirectArgs{N: int32(s.n), H: int32(s.h), W: int32(s.w), Cin: int32(s.cin), Cout: int32(s.cout),
		Kh: int32(s.kh), Kw: int32(s.kw), Ho: int32(s.ho), Wo: int32(s.wo), Stride: int32(s.stride), Pad: int32(s.pad),
		Dil: int32(s.dil), Groups: int32(s.groups)}
	if acc {
		a.Acc = 1
	}
	return a
}

// convDirectFwd launches conv_direct_fwd_<dt>: y = conv(x, w) + b, one
// thread an output element summing (kh, kw, c) in order.
func (c *cudaImpl) convDirectFwd(y, x, w, b *tensor.Tensor, s *convShape) error {
	a := newConvDirectArgs(s, false)
	n := int64(s.n) * int64(s.outPerImg) * int64(s.cout)
	return launch.ConvDirectFwd(c, dtName(x.DType), gridFor(n, 256), block1(256), 0, devPtr(y), devPtr(x), devPtr(w), devPtr(b), &a)
}

// convDirectBackward writes (acc: adds) the input gradient with
// conv_direct_dx_<dt> (one thread a dx element gathering the (kh, kw, o)
// of its group whose taps land on it) and the weight gradient with
// conv_direct_dw_<dt>_<dw dt> (one warp a dw element: each lane sums
// every 32nd output position in order, then a fixed butterfly of
// shuffles adds the lanes).
func (c *cudaImpl) convDirectBackward(dx, dw, dy, x, w *tensor.Tensor, s *convShape, acc [3]bool) error {
	if dw != nil {
		a := newConvDirectArgs(s, acc[1])
		n := int64(s.cout) * int64(s.k)
		if err := launch.ConvDirectDw(c, dtName(x.DType)+"_"+dtName(dw.DType), gridFor(n, 256/32), block1(256), 0,
			devPtr(dw), devPtr(dy), devPtr(x), &a); err != nil {
			return err
		}
	}
	if dx == nil {
		return nil
	}
	a := newConvDirectArgs(s, acc[0])
	n := int64(s.n) * int64(s.h) * int64(s.w) * int64(s.cin)
	return launch.ConvDirectDx(c, dtName(dx.DType), gridFor(n, 256), block1(256), 0, devPtr(dx), devPtr(dy), devPtr(w), &a)
}

// ---- graph ----

// Conv2D records y = conv2d(x, w) + b (Engine.Conv2D with p, PyTorch's
// nn.Conv2d(Cin, Cout, (KH, KW), stride, padding, dilation, groups) on
// channels-last tensors): x [N,H,W,Cin], w [Cout,KH,KW,Cin/G] (an f32
// master), b [Cout] or nil; y [N,Ho,Wo,Cout] in the graph's activation
// dtype. The geometry is checked as Engine.Conv2D checks it, at
// recording. Under bf16 autocast x, w and b are used through bf16 copies
// (Graph.Cast) whose gradients land in the f32 masters.
func (g *Graph) Conv2D(x, w, b *Var, p Conv2DParams) *Var {
	if !g.ok(x, w) {
		return nil
	}
	g.prefetch("conv2d.cu")
	s, err := convShapeOf("conv2d", x.Value.Shape, w.Value.Shape, p)
	if err != nil {
		g.Fail("conv2d", err)
		return nil
	}
	dt := g.ActDType()
	x, w = g.Cast(x, dt), g.Cast(w, dt)
	in := []*Var{x, w}
	if b != nil {
		b = g.Cast(b, dt)
		in = append(in, b)
	}
	y := g.NewOut("conv2d", dt, s.n, s.ho, s.wo, s.cout)
	if !g.ok(y) {
		return nil
	}
	e := g.e
	g.Record("conv2d", in, []*Var{y}, func(*Grads) error {
		var bv *tensor.Tensor
		if b != nil {
			bv = b.Value
		}
		return e.Conv2D(y.Value, x.Value, w.Value, bv, p)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil {
			return nil
		}
		var db *tensor.Tensor
		if b != nil {
			db = gr.In(2)
		}
		return e.Conv2DBackward(gr.In(0), gr.In(1), db, dy, x.Value, w.Value, p, [3]bool{gr.Acc(0), gr.Acc(1), gr.Acc(2)})
	})
	return y
}
