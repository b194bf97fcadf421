package ops

// The chanbias family: a per-sample channel bias broadcast over the
// spatial positions of channels-last images (a diffusion U-Net's timestep
// embedding added to a feature map: h + emb[:, None, None, :]) and the
// reduction that is its backward (also a convolution's bias gradient):
// libgpu/kernels/chanbias.cu, Graph.AddChannels. Reference and checks:
// opstest/chanbias.go.

import (
	"fmt"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// AddChannels computes y[n, s..., c] = x[n, s..., c] + b[n, c] for x and y
// [N, ..., C] (rank ≥ 2, contiguous, one dtype f32 or bf16; y may be x)
// and b [N, C] of x's dtype, in f32. Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout or exec.ErrDevice.
func (e *Engine) AddChannels(y, x, b *tensor.Tensor) error {
	if err := e.rwCheckElem("add channels", true, x, []string{"x", "y"}, y); err != nil {
		return err
	}
	if x.Rank() < 2 {
		return fmt.Errorf("%w: add channels x %v, want [N, ..., C]", tensor.ErrShape, x.Shape)
	}
	n, c := x.Dim(0), x.Dim(-1)
	if err := e.checkView("add channels b", b, true, []tensor.DType{x.DType}, n, c); err != nil {
		return err
	}
	total := x.Numel()
	if total == 0 {
		return nil
	}
	per := total / n // elements per sample
	return e.dispatch(func(*hostImpl) error {
		ins, err := hostIns(x, b)
		if err != nil {
			return err
		}
		xs, bs := ins[0], ins[1]
		ys, commit, err := hostOut(y, false)
		if err != nil {
			return err
		}
		for i := range ys { // y may be x: each element is read before it is written
			ys[i] = xs[i] + bs[(i/per)*c+i%c]
		}
		return commit()
	}, func(cu *cudaImpl) error {
		inst := "s"
		if c%rwVecWidth == 0 && rwVecOK([]*tensor.Tensor{x, y, b}) {
			inst = "v"
		}
		kernel := launch.CbAddS
		if inst == "v" {
			kernel = launch.CbAddV
		}
		return kernel(cu, dtName(x.DType), rwElemGrid(total, inst), block1(256), 0,
			devPtr(y), devPtr(x), devPtr(b), int64(total), int32(c), int64(per))
	})
}

// SpatialSum computes out[n, c] = Σ_s x[n, s, c] (or adds it to out when
// acc) for x [N, S, C] (contiguous, f32 or bf16) and out [N, C] (f32 or
// x's dtype, contiguous), in f32 with a fixed order of additions: the same
// bits on every run. With N = 1 it is a column sum (a bias gradient).
// Errors as AddChannels.
func (e *Engine) SpatialSum(out, x *tensor.Tensor, acc bool) error {
	if err := e.checkView("spatial sum x", x, true, floatTypes); err != nil {
		return err
	}
	if x.Rank() != 3 {
		return fmt.Errorf("%w: spatial sum x %v, want [N, S, C]", tensor.ErrShape, x.Shape)
	}
	n, s, c := x.Dim(0), x.Dim(1), x.Dim(2)
	if err := e.checkView("spatial sum out", out, true, []tensor.DType{tensor.F32, x.DType}, n, c); err != nil {
		return err
	}
	if n == 0 || c == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		xs, err := hostIn(x)
		if err != nil {
			return err
		}
		sums, commit, err := hostOut(out, acc)
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			row := sums[i*c : (i+1)*c]
			clear(row)
			for j := 0; j < s; j++ {
				src := xs[(i*s+j)*c : (i*s+j+1)*c]
				for k, v := range src {
					row[k] += v
				}
			}
		}
		return commit()
	}, func(cu *cudaImpl) error { return cu.spatialSum(out, x, n, s, c, acc) })
}

// cbChunk is the rows of x one block of cb_sum_partial sums.
const cbChunk = 64

// spatialSum: cb_sum_partial_<dt> writes f32 partial sums of chunks of
// cbChunk·k rows ([N, chunks, C] in scratch, grid (chunks, ⌈C/32⌉, N),
// blocks of 32×8 threads); cb_sum_final_<dt> adds the chunks in order.
func (c *cudaImpl) spatialSum(out, x *tensor.Tensor, n, s, cols int, acc bool) error {
	// Enough chunks to give ~1024 blocks, each at least cbChunk rows.
	colBlocks := (cols + 31) / 32
	chunks := max(1, min((s+cbChunk-1)/cbChunk, 1024/max(1, n*colBlocks)))
	rowsPer := (s + chunks - 1) / chunks
	chunks = (s + rowsPer - 1) / rowsPer
	if s == 0 {
		chunks, rowsPer = 1, 0
	}
	part, err := c.Scratch("chanbias.partials", int64(n)*int64(chunks)*int64(cols)*4)
	if err != nil {
		return err
	}
	if err := launch.CbSumPartial(c, dtName(x.DType), [3]uint32{uint32(chunks), uint32(colBlocks), uint32(n)},
		[3]uint32{32, 8, 1}, 0, part, devPtr(x), int32(s), int32(cols), int32(rowsPer)); err != nil {
		return err
	}
	total := n * cols
	return launch.CbSumFinal(c, dtName(out.DType), grid1((total+255)/256), block1(256), 0,
		devPtr(out), part, int32(n), int32(chunks), int32(cols), launch.Bool(acc))

}

// AddChannels records y = x + b[:, None, ..., None, :] (Engine.AddChannels):
// x [N, ..., C] and b [N, C] of one float dtype (b is cast to x's when they
// differ); y of x's shape and dtype. The backward hands dy to x's gradient
// and sums it over the spatial positions into b's.
func (g *Graph) AddChannels(x, b *Var) *Var {
	if !g.ok(x, b) {
		return nil
	}
	g.prefetch("chanbias.cu")
	if err := rwFloat("add channels x", x); err != nil {
		g.Fail("add channels", err)
		return nil
	}
	xs := x.Value.Shape
	if len(xs) < 2 || !tensor.SameShape(b.Value.Shape, []int{xs[0], xs[len(xs)-1]}) {
		g.Fail("add channels", fmt.Errorf("%w: x %v, b %v (want [N, ..., C] and [N, C])", tensor.ErrShape, xs, b.Value.Shape))
		return nil
	}
	b = g.Cast(b, x.Value.DType)
	y := g.NewOut("addchannels", x.Value.DType, xs...)
	if !g.ok(y) {
		return nil
	}
	e := g.e
	n, c := xs[0], xs[len(xs)-1]
	g.Record("addchannels", []*Var{x, b}, []*Var{y}, func(*Grads) error {
		return e.AddChannels(y.Value, x.Value, b.Value)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil {
			return nil
		}
		if dx := gr.In(0); dx != nil {
			if err := e.Scale(dx, dy, 1, gr.Acc(0)); err != nil {
				return err
			}
		}
		if db := gr.In(1); db != nil {
			dy3, err := dy.View(n, -1, c)
			if err != nil {
				return err
			}
			return e.SpatialSum(db, dy3, gr.Acc(1))
		}
		return nil
	})
	return y
}
