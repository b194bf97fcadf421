package ops

// The resample family: a U-Net's spatial down- and up-sampling on
// channels-last images — k×k average pooling and k× nearest-neighbour
// upsampling, forward and backward (libgpu/kernels/resample.cu), and
// Graph.AvgPool2D, Graph.Upsample2D. Reference and checks:
// opstest/resample.go.

import (
	"fmt"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// rsCheck validates a resampling between small [N, h, w, C] and large
// [N, k·h, k·w, C] images (contiguous, one float dtype).
func (e *Engine) rsCheck(op string, small, large *tensor.Tensor, k int) error {
	if k < 1 {
		return fmt.Errorf("%w: %s factor %d", ErrConfig, op, k)
	}
	if err := e.checkView(op+" input", large, true, floatTypes); err != nil {
		return err
	}
	if large.Rank() != 4 {
		return fmt.Errorf("%w: %s of %v, want [N, H, W, C]", tensor.ErrShape, op, large.Shape)
	}
	n, h, w, c := large.Dim(0), large.Dim(1), large.Dim(2), large.Dim(3)
	if h%k != 0 || w%k != 0 {
		return fmt.Errorf("%w: %s of a %d×%d image by %d", tensor.ErrShape, op, h, w, k)
	}
	return e.checkView(op+" output", small, true, []tensor.DType{large.DType}, n, h/k, w/k, c)
}

// AvgPool2D computes y[n,i,j,c] = Σ_{a,b<k} x[n, k·i+a, k·j+b, c] / k² (PyTorch's
// F.avg_pool2d(x, k) on the channels-first equivalent) for x [N, H, W, C]
// with H, W multiples of k and y [N, H/k, W/k, C], contiguous, one dtype
// (f32 or bf16), in f32. Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout, exec.ErrDevice or ErrConfig.
func (e *Engine) AvgPool2D(y, x *tensor.Tensor, k int) error {
	if err := e.rsCheck("avgpool", y, x, k); err != nil {
		return err
	}
	return e.resample(launch.RsPoolFwd, true, y, x, k, false, func(small, large []float32, s rsShape) {
		inv := 1 / float32(k*k)
		for i := range small {
			var t float32
			s.each(i, func(j int) { t += large[j] })
			small[i] = t * inv
		}
	})
}

// AvgPool2DBackward computes dx[n,h,w,c] = dy[n, h/k, w/k, c]/k², or adds it to
// dx when acc; shapes as AvgPool2D (dx as x, dy as y). Errors as AvgPool2D.
func (e *Engine) AvgPool2DBackward(dx, dy *tensor.Tensor, k int, acc bool) error {
	if err := e.rsCheck("avgpool backward", dy, dx, k); err != nil {
		return err
	}
	return e.resample(launch.RsPoolBwd, false, dx, dy, k, acc, func(small, large []float32, s rsShape) {
		inv := 1 / float32(k*k)
		for i, v := range small {
			s.each(i, func(j int) { large[j] = v * inv })
		}
	})
}

// Upsample2D computes y[n,h,w,c] = x[n, h/k, w/k, c] (nearest neighbour,
// PyTorch's F.interpolate(x, scale_factor=k, mode="nearest")) for x [N, H,
// W, C] and y [N, k·H, k·W, C], contiguous, one dtype. Errors as
// AvgPool2D.
func (e *Engine) Upsample2D(y, x *tensor.Tensor, k int) error {
	if err := e.rsCheck("upsample", x, y, k); err != nil {
		return err
	}
	return e.resample(launch.RsUpFwd, false, y, x, k, false, func(small, large []float32, s rsShape) {
		for i, v := range small {
			s.each(i, func(j int) { large[j] = v })
		}
	})
}

// Upsample2DBackward computes dx[n,i,j,c] = Σ_{a,b<k} dy[n, k·i+a, k·j+b, c]
// (in a fixed order), or adds it to dx when acc; shapes as Upsample2D (dx
// as x, dy as y). Errors as AvgPool2D.
func (e *Engine) Upsample2DBackward(dx, dy *tensor.Tensor, k int, acc bool) error {
	if err := e.rsCheck("upsample backward", dx, dy, k); err != nil {
		return err
	}
	return e.resample(launch.RsUpBwd, true, dx, dy, k, acc, func(small, large []float32, s rsShape) {
		for i := range small {
			var t float32
			s.each(i, func(j int) { t += large[j] })
			small[i] = t
		}
	})
}

// rsShape is the small image's geometry and the factor.
type rsShape struct{ h, w, c, k int }

// each calls f with the index in the large image of every element that
// maps to element i of the small one, in (a, b) order.
func (s rsShape) each(i int, f func(j int)) {
	c := i % s.c
	q := i / s.c
	x := q % s.w
	q /= s.w
	y := q % s.h
	n := q / s.h
	W := s.w * s.k
	for a := 0; a < s.k; a++ {
		for b := 0; b < s.k; b++ {
			f(((n*s.h*s.k+y*s.k+a)*W+x*s.k+b)*s.c + c)
		}
	}
}

// rsKernel is the launcher of one of resample.cu's kernels.
type rsKernel func(l launch.Launcher, inst string, grid, block [3]uint32, smem uint32, y, x cuda.DevicePtr, n int64, h, w, c, k, acc int32) error

// resample runs kernel (out written from in; acc adds) on CUDA, or host on
// the small and large images' f32 values: out is small (outSmall) for
// rs_pool_fwd and rs_up_bwd, large otherwise.
func (e *Engine) resample(kernel rsKernel, outSmall bool, out, in *tensor.Tensor, k int, acc bool, host func(small, large []float32, s rsShape)) error {
	n := out.Numel()
	if n == 0 {
		return nil
	}
	small := in
	if outSmall {
		small = out
	}
	s := rsShape{h: small.Dim(1), w: small.Dim(2), c: small.Dim(3), k: k}
	return e.dispatch(func(*hostImpl) error {
		src, err := hostIn(in)
		if err != nil {
			return err
		}
		dst, commit, err := hostOut(out, acc)
		if err != nil {
			return err
		}
		if outSmall {
			host(dst, src, s)
		} else {
			host(src, dst, s)
		}
		return commit()
	}, func(c *cudaImpl) error {
		return kernel(c, dtName(out.DType), gridFor(int64(n), 256), block1(256), 0,
			devPtr(out), devPtr(in), int64(n), int32(s.h), int32(s.w), int32(s.c), int32(k), launch.Bool(acc))
	})
}

// AvgPool2D records y = avgpool(x, k) (Engine.AvgPool2D): x [N, H, W, C],
// y [N, H/k, W/k, C] of x's dtype.
func (g *Graph) AvgPool2D(x *Var, k int) *Var {
	return g.resample("avgpool", x, k, true)
}

// Upsample2D records y = nearest-neighbour upsampling of x by k
// (Engine.Upsample2D): x [N, H, W, C], y [N, k·H, k·W, C] of x's dtype.
func (g *Graph) Upsample2D(x *Var, k int) *Var {
	return g.resample("upsample", x, k, false)
}

func (g *Graph) resample(op string, x *Var, k int, down bool) *Var {
	if !g.ok(x) {
		return nil
	}
	g.prefetch("resample.cu")
	if err := rwFloat(op+" x", x); err != nil {
		g.Fail(op, err)
		return nil
	}
	xs := x.Value.Shape
	if len(xs) != 4 || k < 1 || (down && (xs[1]%k != 0 || xs[2]%k != 0)) {
		g.Fail(op, fmt.Errorf("%w: %s of %v by %d", tensor.ErrShape, op, xs, k))
		return nil
	}
	shape := []int{xs[0], xs[1] * k, xs[2] * k, xs[3]}
	if down {
		shape = []int{xs[0], xs[1] / k, xs[2] / k, xs[3]}
	}
	y := g.NewOut(op, x.Value.DType, shape...)
	e := g.e
	g.Record(op, []*Var{x}, []*Var{y}, func(*Grads) error {
		if down {
			return e.AvgPool2D(y.Value, x.Value, k)
		}
		return e.Upsample2D(y.Value, x.Value, k)
	}, func(gr *Grads) error {
		dy, dx := gr.Out(0), gr.In(0)
		if dy == nil || dx == nil {
			return nil
		}
		if down {
			return e.AvgPool2DBackward(dx, dy, k, gr.Acc(0))
		}
		return e.Upsample2DBackward(dx, dy, k, gr.Acc(0))
	})
	return y
}
