package ops

// The precond family: the element-wise and reduction steps of the
// block-diagonal preconditioners Shampoo and SOAP (libgpu/optim), between
// the batched GEMMs of the GEMM family and the roots and eigenbases of the
// matroot family. A parameter is partitioned into blocks (Blocking); the
// steps read and write its "blocked" form, a contiguous [count, BR, BC]
// tensor on which every block's products are one batched GEMM. Kernels:
// libgpu/kernels/precond.cu. Reference and checks: opstest/precond.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// Blocking partitions an M×N matrix into Rows×Cols blocks of BR×BC (Anil
// et al. 2020, "Scalable second order optimization for deep learning",
// §3.1: block-diagonal preconditioners for large layers). Block b =
// bi·Cols + bj holds rows [bi·BR, bi·BR + BR) and columns [bj·BC, bj·BC +
// BC); the last block row and column are zero-padded past M and N.
type Blocking struct {
	M, N, BR, BC, Rows, Cols int
}

// NewBlocking partitions m×n into balanced blocks of at most maxBlock
// rows and columns: Rows = ⌈m/maxBlock⌉ and BR = ⌈m/Rows⌉ (so a 1152×384
// matrix with maxBlock 1024 has 2×1 blocks of 576×384), the same for
// columns. ErrConfig for non-positive sizes.
func NewBlocking(m, n, maxBlock int) (Blocking, error) {
	if m < 1 || n < 1 || maxBlock < 1 {
		return Blocking{}, fmt.Errorf("%w: blocking of %d×%d with max block %d", ErrConfig, m, n, maxBlock)
	}
	rows, cols := (m+maxBlock-1)/maxBlock, (n+maxBlock-1)/maxBlock
	return Blocking{M: m, N: n, Rows: rows, Cols: cols, BR: (m + rows - 1) / rows, BC: (n + cols - 1) / cols}, nil
}

// Count is the number of blocks.
func (b Blocking) Count() int { return b.Rows * b.Cols }

// Shape is the shape of the blocked form: [Count, BR, BC].
func (b Blocking) Shape() []int { return []int{b.Count(), b.BR, b.BC} }

// RealRows is the number of rows of block b inside the matrix (BR but for
// the last block row); RealCols likewise.
func (b Blocking) RealRows(blk int) int { return min(b.BR, b.M-(blk/b.Cols)*b.BR) }

// RealCols is the number of columns of block b inside the matrix.
func (b Blocking) RealCols(blk int) int { return min(b.BC, b.N-(blk%b.Cols)*b.BC) }

// Blocked is the index in the blocked form of element (i, j).
func (b Blocking) Blocked(i, j int) int {
	bi, bj := i/b.BR, j/b.BC
	return ((bi*b.Cols+bj)*b.BR+i-bi*b.BR)*b.BC + j - bj*b.BC
}

func (b Blocking) geom() launch.PcGeom {
	return launch.PcGeom{M: int32(b.M), N: int32(b.N), Br: int32(b.BR), Bc: int32(b.BC), Cols: int32(b.Cols)}
}

func (b Blocking) valid() error {
	if b.M < 1 || b.N < 1 || b.BR < 1 || b.BC < 1 || b.Rows*b.BR < b.M || b.Cols*b.BC < b.N ||
		(b.Rows-1)*b.BR >= b.M || (b.Cols-1)*b.BC >= b.N {
		return fmt.Errorf("%w: blocking %+v", ErrConfig, b)
	}
	return checkDims(b.M, b.N, b.Count()*b.BR*b.BC)
}

// ShampooPrep is the first element-wise step of Shampoo (see
// Engine.ShampooPrep). G, M, V are [M, N] f32 (M and V optimizer state,
// updated in place; M unused when Beta1 is 0); GS, GB, GA are blocked f32
// outputs. T is the step number, from 1; or BC, when set, holds the bias
// corrections on the device ([2] f32: 1−β1ᵗ, 1−β2ᵗ, as Engine.StepCounter
// leaves them), so that a captured step follows the device's counter, and
// T is not read.
type ShampooPrep struct {
	G, M, V    *tensor.Tensor
	GS, GB, GA *tensor.Tensor
	Blk        Blocking
	Beta1      float32
	Beta2      float32
	Eps        float32
	T          int
	BC         *tensor.Tensor
	AdaGrad    bool
}

// ShampooPrep computes, per element g of G (Anil et al. 2020, Algorithm 1
// with the gradient's moving average, and the grafting of Agarwal et al.
// 2020, "Disentangling adaptive gradient methods from learning rates",
// with an Adam or AdaGrad graft):
//
//	m ← β1·m + (1−β1)·g;   m̂ = m/(1−β1ᵗ)            (m̂ = g when β1 = 0)
//	v ← β2·v + (1−β2)·g²;  v̂ = v/(1−β2ᵗ)            (Adam graft)
//	v ← v + g²;            v̂ = v                    (AdaGrad graft)
//	GS = g, GB = m̂, GA = m̂/(√v̂ + ε)                 (blocked, padding 0)
//
// GS feeds the statistics, GB the preconditioned direction, GA the graft.
// Errors wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice
// or ErrConfig.
func (e *Engine) ShampooPrep(s ShampooPrep) error { return e.ShampooPreps([]ShampooPrep{s}) }

// ShampooPreps is ShampooPrep for several parameters at once (one
// multi-tensor launch per 32 on a GPU: shampoo_prep_multi). They share
// Beta1, Beta2, Eps, T, BC and AdaGrad (else ErrConfig).
func (e *Engine) ShampooPreps(ps []ShampooPrep) error {
	if len(ps) == 0 {
		return nil
	}
	s0 := ps[0]
	for i, s := range ps {
		if err := s.Blk.valid(); err != nil {
			return err
		}
		mn := []int{s.Blk.M, s.Blk.N}
		for _, c := range []struct {
			what  string
			t     *tensor.Tensor
			shape []int
		}{{"G", s.G, mn}, {"V", s.V, mn}, {"GS", s.GS, s.Blk.Shape()}, {"GB", s.GB, s.Blk.Shape()}, {"GA", s.GA, s.Blk.Shape()}} {
			if err := e.checkView("shampoo prep "+c.what, c.t, true, f32Only, c.shape...); err != nil {
				return err
			}
		}
		if s.Beta1 > 0 {
			if err := e.checkView("shampoo prep M", s.M, true, f32Only, mn...); err != nil {
				return err
			}
		}
		if s.Beta1 != s0.Beta1 || s.Beta2 != s0.Beta2 || s.Eps != s0.Eps || s.T != s0.T || s.BC != s0.BC || s.AdaGrad != s0.AdaGrad {
			return fmt.Errorf("%w: shampoo prep %d's settings differ from the first's", ErrConfig, i)
		}
	}
	s := s0
	if !(s.Beta1 >= 0 && s.Beta1 < 1 && s.Beta2 > 0 && s.Beta2 <= 1 && s.Eps > 0 && (s.T >= 1 || s.BC != nil)) {
		return fmt.Errorf("%w: shampoo prep β1 %v, β2 %v, ε %v, t %d", ErrConfig, s.Beta1, s.Beta2, s.Eps, s.T)
	}
	if s.BC != nil {
		if err := e.check("shampoo prep BC", s.BC, tensor.F32, 2); err != nil {
			return err
		}
	}
	var bc1, bc2 float32
	if s.BC == nil {
		bc1 = float32(1 - math.Pow(float64(s.Beta1), float64(s.T)))
		bc2 = float32(1 - math.Pow(float64(s.Beta2), float64(s.T)))
	}
	if s.AdaGrad {
		bc2 = 1
	}
	return e.dispatch(func(*hostImpl) error {
		if s.BC != nil {
			bc, _ := s.BC.F32()
			bc1 = bc[0]
			if !s.AdaGrad {
				bc2 = bc[1]
			}
		}
		for _, p := range ps {
			hostShampooPrep(p, bc1, bc2)
		}
		return nil
	}, func(c *cudaImpl) error {
		sizes := make([]int, len(ps))
		for i, p := range ps {
			sizes[i] = p.Blk.Count() * p.Blk.BR * p.Blk.BC
		}
		return mtEach(sizes, func(g mtGroup) error {
			a := &launch.PcPrepArgs{Start: g.start, Count: int32(g.hi - g.lo), Beta1: s.Beta1, Beta2: s.Beta2,
				Bc1: bc1, Bc2: bc2, Eps: s.Eps, Bc: devPtr(s.BC), Adagrad: launch.Bool(s.AdaGrad)}
			for i := g.lo; i < g.hi; i++ {
				p := ps[i]
				a.T[i-g.lo] = launch.PcPrepTensor{Geo: p.Blk.geom(), G: devPtr(p.G), M: devPtr(p.M), V: devPtr(p.V),
					Gs: devPtr(p.GS), Gb: devPtr(p.GB), Ga: devPtr(p.GA), Total: int64(sizes[i])}
			}
			return launch.ShampooPrepMulti(c, grid1(int(g.blocks())), block1(mtBlock), 0, a)
		})
	})
}

// hostShampooPrep is one parameter's ShampooPrep on the host.
func hostShampooPrep(s ShampooPrep, bc1, bc2 float32) {
	g, _ := s.G.F32()
	v, _ := s.V.F32()
	var m []float32
	if s.Beta1 > 0 {
		m, _ = s.M.F32()
	}
	gs, _ := s.GS.F32()
	gb, _ := s.GB.F32()
	ga, _ := s.GA.F32()
	clear(gs)
	clear(gb)
	clear(ga)
	for i := 0; i < s.Blk.M; i++ {
		for j := 0; j < s.Blk.N; j++ {
			k, b := i*s.Blk.N+j, s.Blk.Blocked(i, j)
			gv := g[k]
			mh := gv
			if s.Beta1 > 0 {
				m[k] = s.Beta1*m[k] + (1-s.Beta1)*gv
				mh = m[k] / bc1
			}
			if s.AdaGrad {
				v[k] += gv * gv
			} else {
				v[k] = s.Beta2*v[k] + (1-s.Beta2)*gv*gv
			}
			gs[b], gb[b] = gv, mh
			ga[b] = mh / (float32(math.Sqrt(float64(v[k]/bc2))) + s.Eps)
		}
	}
}

// checkBlocks checks that every tensor is a contiguous f32 [k, r, c] of
// one shape and returns k and r·c.
func (e *Engine) checkBlocks(op string, ts ...*tensor.Tensor) (int, int, error) {
	ref := ts[0]
	for i, t := range ts {
		if err := e.checkView(fmt.Sprintf("%s operand %d", op, i), t, true, f32Only); err != nil {
			return 0, 0, err
		}
		if t.Rank() != 3 || !tensor.SameShape(t.Shape, ref.Shape) {
			return 0, 0, fmt.Errorf("%w: %s: %v and %v (want one [blocks, rows, cols] shape)", tensor.ErrShape, op, ref.Shape, t.Shape)
		}
	}
	return ref.Dim(0), ref.Dim(1) * ref.Dim(2), checkDims(ref.Numel())
}

// GraftScale writes scale[b] = ‖A_b‖_F / ‖S_b‖_F (0 when ‖S_b‖_F is 0)
// for the blocks b of two blocked tensors S and A ([k, r, c] f32) into
// scale ([k] f32): the factor that gives the preconditioned direction S
// the norm of the graft direction A per block (layer-wise grafting,
// Agarwal et al. 2020, applied per block as in Anil et al. 2020).
func (e *Engine) GraftScale(scale, s, a *tensor.Tensor) error {
	k, per, err := e.checkBlocks("graft scale", s, a)
	if err != nil {
		return err
	}
	if err := e.checkView("graft scale out", scale, true, f32Only, k); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		sv, _ := s.F32()
		av, _ := a.F32()
		out, _ := scale.F32()
		for b := 0; b < k; b++ {
			var s0, s1 float64
			for i := b * per; i < (b+1)*per; i++ {
				s0 += float64(sv[i]) * float64(sv[i])
				s1 += float64(av[i]) * float64(av[i])
			}
			out[b] = 0
			if s0 > 0 {
				out[b] = float32(math.Sqrt(s1 / s0))
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		chunks := min(max((per+8191)/8192, 1), 256)
		part, err := c.Scratch("graft.part", int64(k*chunks*2*4))
		if err != nil {
			return err
		}
		if err := launch.PcSumsq(c, [3]uint32{uint32(chunks), uint32(k), 1}, block1(256), 0,
			devPtr(s), devPtr(a), part, int64(per), int32(chunks)); err != nil {
			return err
		}
		return launch.PcGraftScale(c, grid1((k+127)/128), block1(128), 0, part, int32(chunks), int32(k), devPtr(scale))
	})
}

// BlockApply is a parameter update from a blocked direction (see
// Engine.BlockApply).
type BlockApply struct {
	P, D, Scale     *tensor.Tensor
	Blk             Blocking
	LR, Coef, Decay float32
	LRScale         *tensor.Tensor // [1] f32 on the device multiplying LR (a schedule), or nil
	// CoefBC, when set, holds bias corrections on the device ([2] f32:
	// 1−β1ᵗ, 1−β2ᵗ, as Engine.StepCounter leaves them) and Coef is
	// multiplied by √(1−β2ᵗ)/(1−β1ᵗ), Adam's step-size correction, so a
	// captured step follows the counter.
	CoefBC *tensor.Tensor
}

// BlockApply updates P ([M, N] f32) in place from the blocked direction D
// ([Count, BR, BC] f32) and an optional per-block factor Scale ([Count]
// f32, nil: 1):
//
//	p ← p − lr·(coef·Scale[b]·D[b, r, c] + Decay·p),   lr = LR·LRScale[0] (LR without LRScale)
//
// with coef = Coef, or Coef·√CoefBC[1]/CoefBC[0] with CoefBC, for every
// element (i, j) of P in block b at (r, c): the decoupled weight
// decay of Loshchilov & Hutter 2019 with the step of a preconditioned
// method.
func (e *Engine) BlockApply(a BlockApply) error { return e.BlockApplies([]BlockApply{a}) }

// BlockApplies is BlockApply for several parameters at once (one
// multi-tensor launch per 32 on a GPU: block_apply_multi). They share LR,
// Coef, Decay, LRScale and CoefBC (else ErrConfig).
func (e *Engine) BlockApplies(as []BlockApply) error {
	if len(as) == 0 {
		return nil
	}
	a0 := as[0]
	for i, a := range as {
		if err := a.Blk.valid(); err != nil {
			return err
		}
		if err := e.checkView("block apply P", a.P, true, f32Only, a.Blk.M, a.Blk.N); err != nil {
			return err
		}
		if err := e.checkView("block apply D", a.D, true, f32Only, a.Blk.Shape()...); err != nil {
			return err
		}
		if a.Scale != nil {
			if err := e.checkView("block apply Scale", a.Scale, true, f32Only, a.Blk.Count()); err != nil {
				return err
			}
		}
		if a.LR != a0.LR || a.Coef != a0.Coef || a.Decay != a0.Decay || a.LRScale != a0.LRScale || a.CoefBC != a0.CoefBC {
			return fmt.Errorf("%w: block apply %d's settings differ from the first's", ErrConfig, i)
		}
	}
	if a0.LRScale != nil {
		if err := e.check("block apply LRScale", a0.LRScale, tensor.F32, 1); err != nil {
			return err
		}
	}
	if a0.CoefBC != nil {
		if err := e.check("block apply CoefBC", a0.CoefBC, tensor.F32, 2); err != nil {
			return err
		}
	}
	return e.dispatch(func(*hostImpl) error {
		lr := a0.LR
		if a0.LRScale != nil {
			ls, _ := a0.LRScale.F32()
			lr *= ls[0]
		}
		coef := a0.Coef
		if a0.CoefBC != nil {
			bc, _ := a0.CoefBC.F32()
			coef *= float32(math.Sqrt(float64(bc[1]))) / bc[0]
		}
		for _, a := range as {
			p, _ := a.P.F32()
			d, _ := a.D.F32()
			var sc []float32
			if a.Scale != nil {
				sc, _ = a.Scale.F32()
			}
			per := a.Blk.BR * a.Blk.BC
			for i := 0; i < a.Blk.M; i++ {
				for j := 0; j < a.Blk.N; j++ {
					k, b := i*a.Blk.N+j, a.Blk.Blocked(i, j)
					s := float32(1)
					if sc != nil {
						s = sc[b/per]
					}
					p[k] -= lr * (coef*s*d[b] + a.Decay*p[k])
				}
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		sizes := make([]int, len(as))
		for i, a := range as {
			sizes[i] = a.Blk.M * a.Blk.N
		}
		return mtEach(sizes, func(g mtGroup) error {
			args := &launch.PcApplyArgs{Start: g.start, Count: int32(g.hi - g.lo), Lr: a0.LR, Coef: a0.Coef, Wd: a0.Decay,
				LrScale: devPtr(a0.LRScale), Bc: devPtr(a0.CoefBC)}
			for i := g.lo; i < g.hi; i++ {
				a := as[i]
				args.T[i-g.lo] = launch.PcApplyTensor{Geo: a.Blk.geom(), P: devPtr(a.P), D: devPtr(a.D), Scale: devPtr(a.Scale),
					Total: int64(sizes[i])}
			}
			return launch.BlockApplyMulti(c, grid1(int(g.blocks())), block1(mtBlock), 0, args)
		})
	})
}

// SOAPPrep updates SOAP's first moment M ([M, N] f32) from the gradient G
// and writes blocked copies of both (GS = g, GM = m, padding 0):
//
//	m ← β1·m + (1−β1)·g
//
// (Vyas et al. 2024, "SOAP: Improving and stabilizing Shampoo using
// Adam", Algorithm 1: the moment is kept in the original coordinates and
// rotated into the eigenbasis each step.)
func (e *Engine) SOAPPrep(g, m, gs, gm *tensor.Tensor, blk Blocking, beta1 float32) error {
	return e.SOAPPreps([]SOAPTensors{{X: g, Y: m, W: gs, Z: gm, Blk: blk}}, beta1)
}

// SOAPTensors is one parameter's tensors in SOAPPreps (X = G, Y = M, W =
// GS, Z = GM) or SOAPAdams (X = GR, U = MR, Y = V, W = out), blocked as
// Blk says.
type SOAPTensors struct {
	X, U, Y, W, Z *tensor.Tensor
	Blk           Blocking
}

// SOAPPreps is SOAPPrep for several parameters at once (one multi-tensor
// launch per 32 on a GPU: soap_prep_multi).
func (e *Engine) SOAPPreps(ts []SOAPTensors, beta1 float32) error {
	if !(beta1 >= 0 && beta1 < 1) {
		return fmt.Errorf("%w: soap prep β1 %v", ErrConfig, beta1)
	}
	for _, t := range ts {
		blk := t.Blk
		if err := blk.valid(); err != nil {
			return err
		}
		for _, c := range []struct {
			what  string
			t     *tensor.Tensor
			shape []int
		}{{"G", t.X, []int{blk.M, blk.N}}, {"M", t.Y, []int{blk.M, blk.N}}, {"GS", t.W, blk.Shape()}, {"GM", t.Z, blk.Shape()}} {
			if err := e.checkView("soap prep "+c.what, c.t, true, f32Only, c.shape...); err != nil {
				return err
			}
		}
	}
	if len(ts) == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		for _, t := range ts {
			blk := t.Blk
			gv, _ := t.X.F32()
			mv, _ := t.Y.F32()
			gsv, _ := t.W.F32()
			gmv, _ := t.Z.F32()
			clear(gsv)
			clear(gmv)
			for i := 0; i < blk.M; i++ {
				for j := 0; j < blk.N; j++ {
					k, b := i*blk.N+j, blk.Blocked(i, j)
					mv[k] = beta1*mv[k] + (1-beta1)*gv[k]
					gsv[b], gmv[b] = gv[k], mv[k]
				}
			}
		}
		return nil
	}, func(c *cudaImpl) error { return c.soapMulti(launch.SoapPrepMulti, ts, beta1, 0) })
}

// soapMulti launches a soap_*_multi kernel over ts, 32 per launch.
func (c *cudaImpl) soapMulti(kernel func(launch.Launcher, [3]uint32, [3]uint32, uint32, *launch.PcSoapArgs) error,
	ts []SOAPTensors, beta, eps float32) error {
	sizes := make([]int, len(ts))
	for i, t := range ts {
		sizes[i] = t.Blk.Count() * t.Blk.BR * t.Blk.BC
	}
	return mtEach(sizes, func(g mtGroup) error {
		a := &launch.PcSoapArgs{Start: g.start, Count: int32(g.hi - g.lo), Beta: beta, Eps: eps}
		for i := g.lo; i < g.hi; i++ {
			t := ts[i]
			a.T[i-g.lo] = launch.PcSoapTensor{Geo: t.Blk.geom(), X: devPtr(t.X), U: devPtr(t.U), Y: devPtr(t.Y),
				W: devPtr(t.W), Z: devPtr(t.Z), Total: int64(sizes[i])}
		}
		return kernel(c, grid1(int(g.blocks())), block1(mtBlock), 0, a)
	})
}

// SOAPAdam is Adam's second moment and step in SOAP's eigenbasis, over
// blocked tensors ([Count, BR, BC] f32): for the rotated gradient GR and
// first moment MR, per element (r, c) of block b inside its real rows and
// columns (Blocking.RealRows, RealCols),
//
//	v ← β2·v + (1−β2)·gr²;   out = mr/(√v + ε)
//
// and out = 0 elsewhere (the padded coordinates, which PadDiag puts last in
// the ascending eigenbasis). Vyas et al. 2024, Algorithm 1.
func (e *Engine) SOAPAdam(v, gr, mr, out *tensor.Tensor, blk Blocking, beta2, eps float32) error {
	return e.SOAPAdams([]SOAPTensors{{X: gr, U: mr, Y: v, W: out, Blk: blk}}, beta2, eps)
}

// SOAPAdams is SOAPAdam for several parameters at once (one multi-tensor
// launch per 32 on a GPU: soap_adam_multi).
func (e *Engine) SOAPAdams(ts []SOAPTensors, beta2, eps float32) error {
	if !(beta2 >= 0 && beta2 < 1 && eps > 0) {
		return fmt.Errorf("%w: soap adam β2 %v, ε %v", ErrConfig, beta2, eps)
	}
	for _, t := range ts {
		if err := t.Blk.valid(); err != nil {
			return err
		}
		for _, c := range []struct {
			what string
			t    *tensor.Tensor
		}{{"V", t.Y}, {"GR", t.X}, {"MR", t.U}, {"out", t.W}} {
			if err := e.checkView("soap adam "+c.what, c.t, true, f32Only, t.Blk.Shape()...); err != nil {
				return err
			}
		}
	}
	if len(ts) == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		for _, t := range ts {
			blk := t.Blk
			vv, _ := t.Y.F32()
			g, _ := t.X.F32()
			m, _ := t.U.F32()
			o, _ := t.W.F32()
			per := blk.BR * blk.BC
			for i := range o {
				b, k := i/per, i%per
				if k/blk.BC >= blk.RealRows(b) || k%blk.BC >= blk.RealCols(b) {
					o[i] = 0
					continue
				}
				vv[i] = beta2*vv[i] + (1-beta2)*g[i]*g[i]
				o[i] = m[i] / (float32(math.Sqrt(float64(vv[i]))) + eps)
			}
		}
		return nil
	}, func(c *cudaImpl) error { return c.soapMulti(launch.SoapAdamMulti, ts, beta2, eps) })
}

// PadDiag sets, for each matrix b of s ([count, d, d] f32, positive
// semi-definite in its leading real[b] × real[b] part and zero elsewhere:
// the statistics of a zero-padded block), the padded diagonal entries
// s_ii, i ≥ real[b], to 2·Σ_{i<real[b]} s_ii + 1: above every eigenvalue of
// the real part, so that an eigendecomposition keeps the padded
// coordinates apart (they come last in ascending order) instead of mixing
// them with a degenerate zero eigenspace of the real part. real is [count]
// i32 with 1 ≤ real[b] ≤ d.
func (e *Engine) PadDiag(s, real *tensor.Tensor) error {
	if err := e.checkView("pad diag s", s, true, f32Only); err != nil {
		return err
	}
	batch, d, err := rootGeom("pad diag s", s)
	if err != nil {
		return err
	}
	if err := e.checkView("pad diag real", real, true, []tensor.DType{tensor.I32}, batch); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		sv, _ := s.F32()
		rv, _ := real.I32()
		for b := 0; b < batch; b++ {
			re := int(rv[b])
			if re < 1 || re > d {
				return fmt.Errorf("%w: pad diag real[%d] = %d for order %d", ErrConfig, b, re, d)
			}
			var tr float32
			for i := 0; i < re; i++ {
				tr += sv[(b*d+i)*d+i]
			}
			for i := re; i < d; i++ {
				sv[(b*d+i)*d+i] = 2*tr + 1
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.PadDiag(c, grid1(batch), block1(256), 0, devPtr(s), devPtr(real), int32(d))
	})
}
