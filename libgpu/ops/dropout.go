package ops

// The dropout family: dropout with a counter-based RNG whose masks are
// bitwise the same on the host and on CUDA and are recomputed, not stored,
// in the backward (libgpu/kernels/dropout.cu), and Graph.Dropout.
// Reference and checks: opstest/dropout.go.

import (
	"fmt"
	"math"
	"math/bits"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// Philox4x32-10 constants (Salmon, Moraes, Dror & Shaw, "Parallel random
// numbers: as easy as 1, 2, 3", SC'11; Random123's philox.h).
const (
	philoxM0 = 0xD2511F53
	philoxM1 = 0xCD9E8D57
	philoxW0 = 0x9E3779B9 // golden ratio
	philoxW1 = 0xBB67AE85 // √3 − 1
)

// Philox4x32 is the Philox4x32-10 block function: 10 rounds on the 128-bit
// counter ctr under the 64-bit key (Random123's philox4x32_R(10, ctr, key);
// the key is bumped before every round but the first). dropout.cu computes
// the same.
func Philox4x32(ctr [4]uint32, key [2]uint32) [4]uint32 {
	c, k0, k1 := ctr, key[0], key[1]
	for r := 0; r < 10; r++ {
		if r > 0 {
			k0 += philoxW0
			k1 += philoxW1
		}
		hi0, lo0 := bits.Mul32(philoxM0, c[0])
		hi1, lo1 := bits.Mul32(philoxM1, c[2])
		c = [4]uint32{hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0}
	}
	return c
}

// dropoutU is the uniform draw in [0, 1) from a Philox output word: its
// top 24 bits times 2⁻²⁴ (exact in f32).
func dropoutU(r uint32) float32 { return float32(r>>8) * (1.0 / (1 << 24)) }

// DropoutKeep reports whether dropout with probability p keeps element i
// of call-site site at step step under seed: u ≥ p, u the uniform draw
// from word i mod 4 of Philox4x32(ctr, key), ctr = (q low, q high, site,
// step) for the group q = i/4, key = (seed low, seed high). It is the rule
// both backends apply.
func DropoutKeep(seed uint64, site, step uint32, i int64, p float32) bool {
	q := uint64(i) / 4
	r := Philox4x32([4]uint32{uint32(q), uint32(q >> 32), site, step}, [2]uint32{uint32(seed), uint32(seed >> 32)})
	return dropoutU(r[i%4]) >= p
}

// dropoutScale is 1/(1−p), the factor of kept elements (0 when p = 1: none
// is kept).
func dropoutScale(p float32) float32 {
	if p >= 1 {
		return 0
	}
	return 1 / (1 - p)
}

// checkDropout validates p, site and the step counter.
func (e *Engine) checkDropout(p float32, site int, counter *tensor.Tensor) error {
	if !(p >= 0 && p <= 1) {
		return fmt.Errorf("%w: dropout probability %v, want [0, 1]", ErrConfig, p)
	}
	if site < 0 || site > math.MaxUint32 {
		return fmt.Errorf("%w: dropout call-site %d", ErrConfig, site)
	}
	if counter == nil {
		return nil
	}
	if err := e.checkView("dropout counter", counter, true, []tensor.DType{tensor.I32}); err != nil {
		return err
	}
	if counter.Numel() != 1 {
		return fmt.Errorf("%w: dropout counter %v, want one i32", tensor.ErrShape, counter.Shape)
	}
	return nil
}

// Dropout computes y = x·m/(1−p) element-wise (Srivastava et al. 2014,
// inverted dropout as PyTorch's F.dropout in training), m = DropoutKeep(seed,
// site, step, i, p) for element i of x in row-major order: each element is
// kept with probability 1−p. step is read from counter — an i32 scalar on
// the engine's device (the optimizer's step counter) — by the device when
// the op runs, so a captured graph draws a new mask on every replay after
// the counter moves; nil counter means step 0. site tells apart the
// dropout calls of one step (Graph.Dropout numbers them). x and y
// contiguous, of one shape and dtype (f32 or bf16); y may be x. p in
// [0, 1]. Dropped elements are 0 even where x is not finite. The host and
// CUDA backends draw bitwise the same masks and write bitwise the same y.
// Errors wrap tensor.ErrShape, tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice
// or ErrConfig.
func (e *Engine) Dropout(y, x *tensor.Tensor, p float32, seed uint64, site int, counter *tensor.Tensor) error {
	return e.DropoutAt(y, x, p, seed, site, counter, 0)
}

// DropoutAt is Dropout with the elements numbered from off: element i of x
// is kept as DropoutKeep(seed, site, step, off+i, p) says. A shard of a
// larger tensor (rows [r·b, (r+1)·b) of a batch, a data-parallel rank's
// part) passes its first element's index in the whole, off = r·x.Numel(),
// and draws the whole tensor's masks for its part. off ≥ 0.
func (e *Engine) DropoutAt(y, x *tensor.Tensor, p float32, seed uint64, site int, counter *tensor.Tensor, off int64) error {
	if err := e.checkDropout(p, site, counter); err != nil {
		return err
	}
	if err := e.rwCheckElem("dropout", true, x, []string{"x", "y"}, y); err != nil {
		return err
	}
	return e.dropout(y, x, p, seed, site, counter, false, off)
}

// DropoutBackward computes dx = dy·m/(1−p), or adds it to dx when acc, with
// the mask m of the Dropout call with the same p, seed, site and counter
// value (recomputed, not stored: run it before the counter moves). dx and
// dy contiguous, of one shape and dtype; dx may be dy. Errors as Dropout.
func (e *Engine) DropoutBackward(dx, dy *tensor.Tensor, p float32, seed uint64, site int, counter *tensor.Tensor, acc bool) error {
	return e.DropoutBackwardAt(dx, dy, p, seed, site, counter, acc, 0)
}

// DropoutBackwardAt is DropoutBackward for DropoutAt's mask at off.
func (e *Engine) DropoutBackwardAt(dx, dy *tensor.Tensor, p float32, seed uint64, site int, counter *tensor.Tensor, acc bool, off int64) error {
	if err := e.checkDropout(p, site, counter); err != nil {
		return err
	}
	if err := e.rwCheckElem("dropout backward", true, dy, []string{"dy", "dx"}, dx); err != nil {
		return err
	}
	return e.dropout(dx, dy, p, seed, site, counter, acc, off)
}

func (e *Engine) dropout(y, x *tensor.Tensor, p float32, seed uint64, site int, counter *tensor.Tensor, acc bool, off int64) error {
	if off < 0 {
		return fmt.Errorf("%w: dropout element offset %d", ErrConfig, off)
	}
	n := x.Numel()
	if n == 0 {
		return nil
	}
	scale := dropoutScale(p)
	return e.dispatch(func(*hostImpl) error {
		step := uint32(0)
		if counter != nil {
			c, err := counter.I32()
			if err != nil {
				return fmt.Errorf("ops: host backend: %w", err)
			}
			step = uint32(c[0])
		}
		xs, err := hostIn(x)
		if err != nil {
			return err
		}
		ys, commit, err := hostOut(y, acc)
		if err != nil {
			return err
		}
		key := [2]uint32{uint32(seed), uint32(seed >> 32)}
		var r [4]uint32
		last := int64(-1) // the group r holds
		for i := 0; i < n; i++ {
			gi := off + int64(i)
			if q := gi / 4; q != last {
				r = Philox4x32([4]uint32{uint32(q), uint32(uint64(q) >> 32), uint32(site), step}, key)
				last = q
			}
			v := float32(0)
			if dropoutU(r[gi%4]) >= p {
				v = float32(xs[i] * scale) // the conversion forbids fusing with acc's add
			}
			ys[i] = v // y may be x: each element is read before it is written
		}
		return commit()
	}, func(c *cudaImpl) error {
		inst := "s"
		if rwVecOK([]*tensor.Tensor{x, y}) {
			inst = "v"
		}
		return launch.Dropout(c, inst+"_"+dtName(x.DType), gridFor(int64((n+3)/4), 256), block1(256), 0,
			devPtr(y), devPtr(x), int64(n), p, scale, seed, uint32(site), devPtr(counter), launch.Bool(acc), off)
	})
}

// Dropout records y = dropout(x, p) (Engine.DropoutAt) with the graph's
// Seed and Counter, the next call-site number and elements numbered from
// Shard × x's elements (GraphOptions.Shard). Outside training
// (GraphOptions.Train false) or with p = 0 it is the identity: it returns x
// and records nothing. y of x's shape and dtype (x contiguous). The
// backward recomputes the mask from the same seed, site and counter, so
// the counter must move only after the backward (the optimizer's step).
func (g *Graph) Dropout(x *Var, p float32) *Var {
	if !g.ok(x) {
		return nil
	}
	if !g.opts.Train || p == 0 {
		return x
	}
	g.prefetch("dropout.cu")
	if err := rwFloat("dropout x", x); err != nil {
		g.Fail("dropout", err)
		return nil
	}
	if !(p > 0 && p <= 1) {
		g.Fail("dropout", fmt.Errorf("%w: dropout probability %v", ErrConfig, p))
		return nil
	}
	if g.opts.Shard < 0 {
		g.Fail("dropout", fmt.Errorf("%w: shard %d", ErrConfig, g.opts.Shard))
		return nil
	}
	site := g.nextSite()
	seed, counter := g.opts.Seed, g.opts.Counter
	off := int64(g.opts.Shard) * int64(x.Value.Numel())
	y := g.NewOut("dropout", x.Value.DType, x.Value.Shape...)
	e := g.e
	g.Record("dropout", []*Var{x}, []*Var{y}, func(*Grads) error {
		return e.DropoutAt(y.Value, x.Value, p, seed, site, counter, off)
	}, func(gr *Grads) error {
		dy, dx := gr.Out(0), gr.In(0)
		if dy == nil || dx == nil {
			return nil
		}
		return e.DropoutBackwardAt(dx, dy, p, seed, site, counter, gr.Acc(0), off)
	})
	return y
}
