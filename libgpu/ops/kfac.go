package ops

// The kfac family: the steps of K-FAC for linear layers (Martens & Grosse
// 2015, "Optimizing neural networks with Kronecker-factored approximate
// curvature") — the Kronecker factors' moving averages from captured
// activations and output gradients (KFACFactor), the factored Tikhonov
// damping (KFACDamping), the preconditioned gradient G⁻¹·∇W·A⁻¹
// (KFACPrecond), the KL-based step clipping (KLClip) and the momentum
// update (KFACApply). Products are the GEMM family's; inverses come from
// the matroot family (InverseRoot with P = 1). Kernels:
// libgpu/kernels/kfac.cu. Reference and checks: opstest/kfac.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// KFACFactor updates a Kronecker factor from a batch of vectors, the rows
// of X ([N, d], f32 or bf16, rows may be strided):
//
//	F ← Beta·F + Alpha·X̄ᵀX̄
//
// with X̄ = [X, 1] (the homogeneous coordinate of a layer's bias, so F is
// [d+1, d+1]) when bias, else X̄ = X (F [d, d]); F is f32 and contiguous.
// Beta 0 overwrites F. For a layer y = x·Wᵀ + b with N input rows a and
// output gradients g (∂L/∂y of the loss L summed over rows), K-FAC's A =
// E[āāᵀ] is Alpha = 1/N with bias, and G = E[ggᵀ] is Alpha = 1/N on g;
// a moving average uses Alpha = (1−ρ)/N, Beta = ρ. The product is the GEMM
// family's (f32 accumulation; TF32 on a GPU engine unless PrecF32), the
// bias row and column a deterministic column sum.
func (e *Engine) KFACFactor(f, x *tensor.Tensor, alpha, beta float32, bias bool) error {
	if err := e.checkView("kfac factor X", x, false, floatTypes); err != nil {
		return err
	}
	if x.Rank() != 2 {
		return fmt.Errorf("%w: kfac factor X is %v, want [N, d]", tensor.ErrShape, x.Shape)
	}
	rows, d := x.Dim(0), x.Dim(1)
	df := d
	if bias {
		df++
	}
	if err := e.checkView("kfac factor F", f, true, f32Only, df, df); err != nil {
		return err
	}
	if rows == 0 || d == 0 {
		return fmt.Errorf("%w: kfac factor of %v", tensor.ErrShape, x.Shape)
	}
	if !(beta >= 0) || alpha != alpha {
		return fmt.Errorf("%w: kfac factor alpha %v, beta %v", ErrConfig, alpha, beta)
	}
	acc := beta != 0
	top := f
	if bias {
		var err error
		if top, err = f.Narrow(0, 0, d); err == nil {
			top, err = top.Narrow(1, 0, d)
		}
		if err != nil {
			return err
		}
	}
	if err := e.Matmul(Matmul{A: x, B: x, D: top, TransA: true, Alpha: alpha, Beta: beta, Accumulate: acc}); err != nil {
		return err
	}
	if !bias {
		return nil
	}
	ld := ldOf(x)
	return e.dispatch(func(*hostImpl) error {
		xv, err := hostIn(x)
		if err != nil {
			return err
		}
		fv, _ := f.F32()
		for j := 0; j <= d; j++ {
			var s float32
			if j < d {
				for i := 0; i < rows; i++ {
					s += xv[i*d+j]
				}
			} else {
				s = float32(rows)
			}
			v := alpha * s
			if acc {
				v += beta * fv[d*df+j]
			}
			fv[d*df+j], fv[j*df+d] = v, v
		}
		return nil
	}, func(c *cudaImpl) error {
		chunks := min(max(rows/256, 1), 64)
		part, err := c.Scratch("kfac.colsum", int64(chunks*d*4))
		if err != nil {
			return err
		}
		if err := launch.KfacColsum(c, dtName(x.DType), [3]uint32{uint32((d + 31) / 32), uint32(chunks), 1}, [3]uint32{32, 8, 1}, 0,
			devPtr(x), part, int64(rows), int32(d), int64(ld)); err != nil {
			return err
		}
		return launch.KfacBiasFinish(c, grid1((d+1+255)/256), block1(256), 0,
			part, int32(chunks), devPtr(f), int32(d), int64(rows), alpha, beta, launch.Bool(acc))
	})
}

// KFACDamping computes the factored Tikhonov damping of a factor pair
// (Martens & Grosse 2015, §6.3): with π = √((tr A/d_A)/(tr G/d_G)) (1
// when a trace is not positive),
//
//	ridgeA = π·√λ,   ridgeG = √λ/π
//
// so that (A + ridgeA·I) ⊗ (G + ridgeG·I) approximates A⊗G + λI. A, G are
// square f32 factors; ridgeA, ridgeG are [1] f32 device scalars (the Ridge
// of InverseRoot). Nothing is read back to the host.
func (e *Engine) KFACDamping(ridgeA, ridgeG, a, g *tensor.Tensor, lambda float32) error {
	da, dg := 0, 0
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
		d    *int
	}{{"A", a, &da}, {"G", g, &dg}} {
		if err := e.checkView("kfac damping "+c.what, c.t, true, f32Only); err != nil {
			return err
		}
		if c.t.Rank() != 2 || c.t.Dim(0) != c.t.Dim(1) || c.t.Dim(0) < 1 {
			return fmt.Errorf("%w: kfac damping %s is %v", tensor.ErrShape, c.what, c.t.Shape)
		}
		*c.d = c.t.Dim(0)
	}
	for _, r := range []*tensor.Tensor{ridgeA, ridgeG} {
		if err := e.checkView("kfac damping ridge", r, true, f32Only, 1); err != nil {
			return err
		}
	}
	if !(lambda >= 0) {
		return fmt.Errorf("%w: kfac damping λ %v", ErrConfig, lambda)
	}
	return e.dispatch(func(*hostImpl) error {
		av, _ := a.F32()
		gv, _ := g.F32()
		var ta, tg float64
		for i := 0; i < da; i++ {
			ta += float64(av[i*da+i])
		}
		for i := 0; i < dg; i++ {
			tg += float64(gv[i*dg+i])
		}
		pi := 1.0
		if ta > 0 && tg > 0 {
			pi = math.Sqrt((ta / float64(da)) / (tg / float64(dg)))
		}
		s := math.Sqrt(float64(lambda))
		ra, _ := ridgeA.F32()
		rg, _ := ridgeG.F32()
		ra[0], rg[0] = float32(pi*s), float32(s/pi)
		return nil
	}, func(c *cudaImpl) error {
		return launch.KfacDamping(c, grid1(1), block1(256), 0,
			devPtr(a), int32(da), devPtr(g), int32(dg), lambda, devPtr(ridgeA), devPtr(ridgeG))
	})
}

// KFACPrecond computes the preconditioned gradient of a linear layer,
//
//	V = G⁻¹·[∇W | ∇b]·A⁻¹
//
// (Martens & Grosse 2015, §4: the Kronecker-factored Fisher's inverse
// applied to the weight gradient), from the inverse factors Ginv ([out,
// out]) and Ainv ([in+1, in+1] with a bias, [in, in] without), the
// gradients GW ([out, in]) and GB ([out] or nil), all f32, into V ([out,
// in+1] or [out, in] f32). With dot ([1] f32, or nil) it also writes
// ⟨V, [∇W | ∇b]⟩, the layer's term of KLClip's sum.
func (e *Engine) KFACPrecond(v, ginv, gw, gb, ainv, dot *tensor.Tensor) error {
	if err := e.checkView("kfac precond GW", gw, true, f32Only); err != nil {
		return err
	}
	if gw.Rank() != 2 {
		return fmt.Errorf("%w: kfac precond GW is %v", tensor.ErrShape, gw.Shape)
	}
	out, in := gw.Dim(0), gw.Dim(1)
	din := in
	if gb != nil {
		din++
		if err := e.checkView("kfac precond GB", gb, true, f32Only, out); err != nil {
			return err
		}
	}
	for _, c := range []kfacCheck{{"V", v, []int{out, din}}, {"Ginv", ginv, []int{out, out}}, {"Ainv", ainv, []int{din, din}}} {
		if err := e.checkView("kfac precond "+c.what, c.t, true, f32Only, c.shape...); err != nil {
			return err
		}
	}
	if dot != nil {
		if err := e.checkView("kfac precond dot", dot, true, f32Only, 1); err != nil {
			return err
		}
	}
	if err := checkDims(out, din, out*din); err != nil {
		return err
	}
	grad := gw
	if gb != nil {
		var err error
		if grad, err = e.ScratchTensor("kfac.grad", tensor.F32, out, din); err != nil {
			return err
		}
		if err := e.dispatch(func(*hostImpl) error {
			w, _ := gw.F32()
			b, _ := gb.F32()
			o, _ := grad.F32()
			for i := 0; i < out; i++ {
				copy(o[i*din:i*din+in], w[i*in:(i+1)*in])
				o[i*din+in] = b[i]
			}
			return nil
		}, func(c *cudaImpl) error {
			total := int64(out) * int64(din)
			return launch.KfacGather(c, gridFor(total, 256), block1(256), 0,
				devPtr(gw), devPtr(gb), devPtr(grad), int32(out), int32(in))
		}); err != nil {
			return err
		}
	}
	tmp, err := e.ScratchTensor("kfac.tmp", tensor.F32, out, din)
	if err != nil {
		return err
	}
	if err := e.Matmul(Matmul{A: ginv, B: grad, D: tmp}); err != nil {
		return err
	}
	if err := e.Matmul(Matmul{A: tmp, B: ainv, D: v}); err != nil {
		return err
	}
	if dot == nil {
		return nil
	}
	n := int64(out) * int64(din)
	return e.dispatch(func(*hostImpl) error {
		vv, _ := v.F32()
		gv, _ := grad.F32()
		var s float64
		for i := range vv {
			s += float64(vv[i]) * float64(gv[i])
		}
		d, _ := dot.F32()
		d[0] = float32(s)
		return nil
	}, func(c *cudaImpl) error {
		chunks := int(min(max(n/8192, 1), 256))
		part, err := c.Scratch("kfac.dot", int64(chunks*4))
		if err != nil {
			return err
		}
		if err := launch.KfacDot(c, grid1(chunks), block1(256), 0, devPtr(v), devPtr(grad), part, n); err != nil {
			return err
		}
		return launch.KfacSum(c, grid1(1), block1(32), 0, part, int32(chunks), devPtr(dot))
	})
}

// KLClip writes nu[0] = min(1, √(κ/(lr²·Σ_l dots[l]))) (1 when the sum is
// not positive): the factor that keeps the step's predicted KL divergence
// lr²·Σ⟨V, ∇⟩ within κ (Ba, Grosse & Martens 2017, "Distributed
// second-order optimization using Kronecker-factored approximations",
// §5). dots is [L] f32 (KFACPrecond's per-layer dot), nu [1] f32.
func (e *Engine) KLClip(nu, dots *tensor.Tensor, lr, kappa float32) error {
	if err := e.checkView("kl clip dots", dots, true, f32Only); err != nil {
		return err
	}
	if dots.Rank() != 1 || dots.Dim(0) < 1 {
		return fmt.Errorf("%w: kl clip dots is %v", tensor.ErrShape, dots.Shape)
	}
	if err := e.checkView("kl clip nu", nu, true, f32Only, 1); err != nil {
		return err
	}
	if !(kappa > 0 && lr >= 0) {
		return fmt.Errorf("%w: kl clip κ %v, lr %v", ErrConfig, kappa, lr)
	}
	return e.dispatch(func(*hostImpl) error {
		dv, _ := dots.F32()
		var s float64
		for _, d := range dv {
			s += float64(d)
		}
		v := 1.0
		if q := float64(lr) * float64(lr) * s; q > 0 {
			v = min(1, math.Sqrt(float64(kappa)/q))
		}
		o, _ := nu.F32()
		o[0] = float32(v)
		return nil
	}, func(c *cudaImpl) error {
		return launch.KlClip(c, grid1(1), block1(32), 0, devPtr(dots), int32(dots.Dim(0)), lr, kappa, devPtr(nu))
	})
}

// KFACApply is the momentum step of a linear layer from its
// preconditioned gradient V ([out, in+1] with a bias, [out, in] without;
// KFACPrecond) scaled by nu ([1] f32 from KLClip, or nil: 1), as
// torch.optim.SGD applies it to a replaced gradient:
//
//	u = ν·V_w + wd·w;  buf_w ← μ·buf_w + u;  w ← w − lr·buf_w
//	u = ν·V_b;         buf_b ← μ·buf_b + u;  b ← b − lr·buf_b
//
// (no weight decay on the bias). W, BufW [out, in]; B, BufB [out] or nil;
// all f32.
func (e *Engine) KFACApply(w, b, bufW, bufB, v, nu *tensor.Tensor, lr, mu, wd float32) error {
	if err := e.checkView("kfac apply W", w, true, f32Only); err != nil {
		return err
	}
	if w.Rank() != 2 {
		return fmt.Errorf("%w: kfac apply W is %v", tensor.ErrShape, w.Shape)
	}
	out, in := w.Dim(0), w.Dim(1)
	din := in
	checks := []kfacCheck{{"BufW", bufW, []int{out, in}}}
	if b != nil {
		din++
		checks = append(checks, kfacCheck{"B", b, []int{out}}, kfacCheck{"BufB", bufB, []int{out}})
	}
	checks = append(checks, kfacCheck{"V", v, []int{out, din}})
	if nu != nil {
		checks = append(checks, kfacCheck{"nu", nu, []int{1}})
	}
	for _, c := range checks {
		if err := e.checkView("kfac apply "+c.what, c.t, true, f32Only, c.shape...); err != nil {
			return err
		}
	}
	if !(lr >= 0 && mu >= 0 && mu < 1 && wd >= 0) {
		return fmt.Errorf("%w: kfac apply lr %v, μ %v, wd %v", ErrConfig, lr, mu, wd)
	}
	total := int64(out) * int64(din)
	return e.dispatch(func(*hostImpl) error {
		wv, _ := w.F32()
		bw, _ := bufW.F32()
		vv, _ := v.F32()
		n := float32(1)
		if nu != nil {
			nv, _ := nu.F32()
			n = nv[0]
		}
		var bv, bb []float32
		if b != nil {
			bv, _ = b.F32()
			bb, _ = bufB.F32()
		}
		for i := 0; i < out; i++ {
			for j := 0; j < din; j++ {
				u := n * vv[i*din+j]
				if j < in {
					o := i*in + j
					bw[o] = mu*bw[o] + u + wd*wv[o]
					wv[o] -= lr * bw[o]
				} else {
					bb[i] = mu*bb[i] + u
					bv[i] -= lr * bb[i]
				}
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.KfacApply(c, gridFor(total, 256), block1(256), 0,
			devPtr(w), devPtr(b), devPtr(bufW), devPtr(bufB), devPtr(v), devPtr(nu), int32(out), int32(in), lr, mu, wd)
	})
}

// kfacCheck is one tensor an op checks: its name, and its shape.
type kfacCheck struct {
	what  string
	t     *tensor.Tensor
	shape []int
}
