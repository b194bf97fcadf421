package ops

// The cast family: f32 ↔ bf16 conversion (libgpu/kernels/cast.cu), and
// Graph.Cast, which autocast uses to give GEMMs bf16 copies of f32 master
// weights. Checks: opstest/cast.go.

import (
	"fmt"
	"math"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// Cast writes src converted to dst's dtype into dst: f32 → bf16 rounds to
// nearest even, bf16 → f32 is exact, equal dtypes copy. Both contiguous,
// of one shape.
func (e *Engine) Cast(dst, src *tensor.Tensor) error {
	if err := e.checkView("cast dst", dst, true, floatTypes); err != nil {
		return err
	}
	if err := e.checkView("cast src", src, true, floatTypes); err != nil {
		return err
	}
	if err := sameShapes("cast", dst, src); err != nil {
		return err
	}
	n := dst.Numel()
	if n == 0 {
		return nil
	}
	if dst.DType == src.DType {
		return e.Copy(dst, src)
	}
	return e.dispatch(func(*hostImpl) error {
		v, err := hostIn(src)
		if err != nil {
			return err
		}
		return dst.WriteFloat32(v)
	}, func(c *cudaImpl) error {
		kernel := launch.CastF32ToBf16
		if src.DType == tensor.BF16 {
			kernel = launch.CastBf16ToF32
		}
		blocks := min(n/256+1, 65535)
		return kernel(c, grid1(blocks), block1(256), 0, devPtr(dst), devPtr(src), int64(n))
	})
}

// Casts writes each src[i] converted to dst[i]'s dtype into dst[i], as
// Cast does for one pair (both contiguous, of one shape; f32 ↔ bf16 or
// equal dtypes). On CUDA every f32 → bf16 pair goes into one multi-tensor
// launch (up to 128 tensors per launch; cast_multi_f32_to_bf16), the others
// as Cast. A step's autocast copies of its f32 master weights are one
// launch instead of one per weight. Errors as Cast, naming the pair.
func (e *Engine) Casts(dst, src []*tensor.Tensor) error {
	if len(dst) != len(src) {
		return fmt.Errorf("%w: casts of %d sources into %d destinations", tensor.ErrShape, len(src), len(dst))
	}
	var md, ms []*tensor.Tensor
	var rest []int
	for i := range dst {
		if err := e.checkView(fmt.Sprintf("casts dst[%d]", i), dst[i], true, floatTypes); err != nil {
			return err
		}
		if err := e.checkView(fmt.Sprintf("casts src[%d]", i), src[i], true, floatTypes); err != nil {
			return err
		}
		if err := sameShapes(fmt.Sprintf("casts[%d]", i), dst[i], src[i]); err != nil {
			return err
		}
		if src[i].DType == tensor.F32 && dst[i].DType == tensor.BF16 {
			if dst[i].Numel() > 0 {
				md, ms = append(md, dst[i]), append(ms, src[i])
			}
		} else {
			rest = append(rest, i)
		}
	}
	for _, i := range rest {
		if err := e.Cast(dst[i], src[i]); err != nil {
			return err
		}
	}
	if len(md) == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		for i := range md {
			v, err := hostIn(ms[i])
			if err != nil {
				return err
			}
			if err := md[i].WriteFloat32(v); err != nil {
				return err
			}
		}
		return nil
	}, func(c *cudaImpl) error { return c.castMulti(md, ms) })
}

// Multi-tensor casts (cast.cu): up to castMTMax tensors per launch travel
// by value as a __grid_constant__ struct; tensor i owns blocks
// [start[i], start[i+1]), castMTChunk elements per block.
const (
	castMTMax   = 128  // CAST_MT_MAX (3.6 KB of parameters: under the 4 KiB every architecture takes)
	castMTChunk = 4096 // CAST_MT_CHUNK
)

// castMTPlan fills the launches' arguments for casting src[i] into dst[i]
// (f32 → bf16, contiguous, none empty): castMTMax tensors per launch.
func castMTPlan(dst, src []*tensor.Tensor) ([]*launch.CastMtArgs, error) {
	var out []*launch.CastMtArgs
	for lo := 0; lo < len(dst); lo += castMTMax {
		hi := min(lo+castMTMax, len(dst))
		a := &launch.CastMtArgs{Count: int32(hi - lo)}
		blocks := int64(0)
		for i := lo; i < hi; i++ {
			n := int64(dst[i].Numel())
			a.T[i-lo] = launch.CastMtTensor{Dst: devPtr(dst[i]), Src: devPtr(src[i]), N: n}
			a.Start[i-lo] = int32(blocks)
			blocks += (n + castMTChunk - 1) / castMTChunk
			if blocks > math.MaxInt32 {
				return nil, fmt.Errorf("%w: cast launch of %d blocks", tensor.ErrShape, blocks)
			}
		}
		a.Start[hi-lo] = int32(blocks)
		out = append(out, a)
	}
	return out, nil
}

func (c *cudaImpl) castMulti(dst, src []*tensor.Tensor) error {
	plan, err := castMTPlan(dst, src)
	if err != nil {
		return err
	}
	for _, a := range plan {
		if err := launch.CastMultiF32ToBf16(c, grid1(int(a.Start[a.Count])), block1(256), 0, a); err != nil {

			return err
		}
	}
	return nil
}

// Cast records x converted to dt (x itself when it already is dt). The
// copy is made once per step however many ops read it (a tied weight is
// cast once), and its gradient is x's own: ops that read the copy write
// their gradients straight into x's (an f32 master's f32 gradient), so
// only ops that take mixed dtypes — the GEMM family — read casts.
//
// f32 → bf16 casts of values no node computes (params and inputs, set
// before Forward: autograd.Var.Computed) are made together, by one node
// (Engine.Casts: one launch on CUDA) recorded where the graph's first such
// cast is asked for: every one of them is then written before the first
// op that reads any of them, since each is asked for by its first reader,
// recorded after that node. Casts of computed values (an op's f32 output)
// get a node of their own where they are asked for, after their producer.
func (g *Graph) Cast(x *Var, dt tensor.DType) *Var {
	if !g.ok(x) {
		return nil
	}
	if x.Value.DType == dt {
		return x
	}
	key := castKey{v: x, dt: dt}
	if c, ok := g.shared.casts[key]; ok {
		return c
	}
	if !x.Value.Contiguous() {
		g.Fail("cast", fmt.Errorf("%w: cast of a strided %v", tensor.ErrLayout, x.Value.Shape))
		return nil
	}
	g.prefetch("cast.cu")
	buf, err := tensor.Alloc(g.tape.Allocator(), "", dt, x.Value.Shape...)
	if err != nil {
		g.Fail("cast", err)
		return nil
	}
	name := g.name(x.Name + "." + dt.String())
	c, err := g.tape.Alias(name, x, buf, func(gx *tensor.Tensor) (*tensor.Tensor, error) { return gx, nil })
	if err != nil {
		buf.Buf.Free()
		g.Fail("cast", err)
		return nil
	}
	g.shared.owned = append(g.shared.owned, buf)
	e := g.e
	if !x.Computed() && x.Value.DType == tensor.F32 && dt == tensor.BF16 {
		b := g.shared.castBatch
		if b == nil {
			b = &castBatch{}
			g.shared.castBatch = b
			if err := g.tape.Op(g.name("casts"), nil, nil, func(*Grads) error { return e.Casts(b.dst, b.src) }, nil); err != nil {
				g.Fail("cast", err)
				return nil
			}
		}
		b.dst, b.src = append(b.dst, buf), append(b.src, x.Value)
	} else if err := g.tape.Op(name, []*Var{x}, nil, func(*Grads) error { return e.Cast(buf, x.Value) }, nil); err != nil {
		g.Fail("cast", err)
		return nil
	}
	g.shared.casts[key] = c
	return c
}

// castBatch is the casts one Graph node makes together (Graph.Cast).
type castBatch struct{ dst, src []*tensor.Tensor }
