package lm

import (
	"fmt"
	"math"
	"sync"

	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

// fakeWorld joins n ranks that run as goroutines of one process on the
// host: each collective is a barrier at which every rank hands over its
// bytes, and the result is computed from them in rank order. It stands in
// for NCCL (which needs a GPU per rank) in tests of the data-parallel
// trainer on the host; like NCCL, it requires every rank to call the same
// collectives in the same order, and fails a round whose calls differ.
type fakeWorld struct {
	n     int
	mu    sync.Mutex
	cv    *sync.Cond
	gen   int      // rounds completed
	count int      // ranks arrived in this round
	got   [][]byte // this round's contributions
	tags  []string
	out   [][]byte // the last round's, for its ranks to read
	err   error    // a failed rank or a mismatched round: every later call fails
}

func newFakeWorld(n int) *fakeWorld {
	w := &fakeWorld{n: n, got: make([][]byte, n), tags: make([]string, n)}
	w.cv = sync.NewCond(&w.mu)
	return w
}

// fail ends the world: ranks waiting in a collective, and later calls,
// get err (a rank that returned early would otherwise leave the others
// waiting forever, as a dead peer does with NCCL).
func (w *fakeWorld) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
	w.cv.Broadcast()
}

// exchange is one round: it returns every rank's b, in rank order.
func (w *fakeWorld) exchange(rank int, tag string, b []byte) ([][]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return nil, w.err
	}
	g := w.gen
	w.got[rank], w.tags[rank] = b, tag
	w.count++
	if w.count == w.n {
		for r, t := range w.tags {
			if t != w.tags[0] {
				w.err = fmt.Errorf("fake collective: rank %d called %s while rank 0 called %s", r, t, w.tags[0])
			}
		}
		w.out = append([][]byte(nil), w.got...)
		w.count = 0
		w.gen++
		w.cv.Broadcast()
	}
	for g == w.gen && w.err == nil {
		w.cv.Wait()
	}
	if w.err != nil {
		return nil, w.err
	}
	return w.out, nil
}

// fakeComm is rank rank's member of a fakeWorld (a driver.Collective).
type fakeComm struct {
	w    *fakeWorld
	rank int
}

func (c *fakeComm) Rank() int    { return c.rank }
func (c *fakeComm) Size() int    { return c.w.n }
func (c *fakeComm) IsSolo() bool { return false }

// AllReduce reduces f32 tensors in rank order, in f32: Sum and Avg add
// rank 0's, then rank 1's, ... and Avg divides by the number of ranks
// (NCCL's ncclAvg; for 2 ranks (a + b)/2, what NCCL computes). It reduces
// bf16 tensors (Sum, Avg: the reducer's compressed buckets) as NCCL does
// in bf16: Avg multiplies each rank's value by 1/n rounded to bf16 first
// (ncclAvg on floating-point types is a pre-multiplied sum, NCCL's
// ncclDevPreMulSum), and each addition's result is rounded to bf16, as a
// bf16 sum carried hop by hop around NCCL's ring is.
func (c *fakeComm) AllReduce(e *ops.Engine, dst, src *tensor.Tensor, op nccl.Op) error {
	if src.DType != dst.DType || dst.Numel() != src.Numel() || (src.DType != tensor.F32 && src.DType != tensor.BF16) ||
		(src.DType == tensor.BF16 && op != nccl.Sum && op != nccl.Avg) {
		return fmt.Errorf("%w: fake all-reduce %v of %v ×%d into %v ×%d", nccl.ErrArg, op, src.DType, src.Numel(), dst.DType, dst.Numel())
	}
	b, err := src.Read()
	if err != nil {
		return err
	}
	all, err := c.w.exchange(c.rank, fmt.Sprintf("all-reduce %v %v of %d", op, src.DType, src.Numel()), b)
	if err != nil {
		return err
	}
	if src.DType == tensor.BF16 {
		return dst.Write(bf16Reduce(all, op, c.w.n))
	}
	out := make([]float32, src.Numel())
	for r, rb := range all {
		v := tensor.BytesAs[float32](rb)
		for i := range out {
			switch {
			case r == 0:
				out[i] = v[i]
			case op == nccl.Max:
				out[i] = float32(math.Max(float64(out[i]), float64(v[i])))
			case op == nccl.Sum || op == nccl.Avg:
				out[i] += v[i]
			default:
				return fmt.Errorf("%w: fake all-reduce with %v", nccl.ErrArg, op)
			}
		}
	}
	if op == nccl.Avg {
		for i := range out {
			out[i] /= float32(c.w.n)
		}
	}
	return dst.WriteF32(out)
}

// bf16Reduce is the bf16 Sum or Avg of n ranks' bytes, in rank order,
// rounding to bf16 after every operation (see AllReduce).
func bf16Reduce(all [][]byte, op nccl.Op, n int) []byte {
	round := func(x float32) float32 { return tensor.BF16ToF32(tensor.BF16FromF32(x)) }
	scale := float32(1)
	if op == nccl.Avg {
		scale = round(1 / float32(n))
	}
	vs := make([][]uint16, len(all))
	for r, rb := range all {
		vs[r] = tensor.BytesAs[uint16](rb)
	}
	out := make([]uint16, len(vs[0]))
	for i := range out {
		var s float32
		for r, v := range vs {
			x := round(tensor.BF16ToF32(v[i]) * scale)
			if r == 0 {
				s = x
			} else {
				s = round(s + x)
			}
		}
		out[i] = tensor.BF16FromF32(s)
	}
	return tensor.AsBytes(out)
}

// BroadcastAll gives every tensor root's bytes.
func (c *fakeComm) BroadcastAll(e *ops.Engine, ts []*tensor.Tensor, root int) error {
	for i, t := range ts {
		b, err := t.Read()
		if err != nil {
			return err
		}
		all, err := c.w.exchange(c.rank, fmt.Sprintf("broadcast %d (%d bytes)", i, len(b)), b)
		if err != nil {
			return err
		}
		if err := t.Write(all[root]); err != nil {
			return err
		}
	}
	return nil
}

// Group runs fn: the fake's collectives are each complete when they
// return.
func (c *fakeComm) Group(e *ops.Engine, fn func() error) error { return fn() }

var _ driver.Collective = (*fakeComm)(nil)
