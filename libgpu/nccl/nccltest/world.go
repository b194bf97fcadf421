package nccltest

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// World joins n ranks that run as goroutines of one process: each
// collective is a barrier at which every rank hands over its bytes, and
// every rank computes the result from all of them in rank order. Like
// NCCL, it requires every rank to call the same collectives in the same
// order with the same sizes, and fails a round whose calls differ (every
// later call then fails too, as a dead peer leaves NCCL's ranks).
// Collectives read and write through Tensor.Read and Write after the
// engine's Sync, so they are complete when they return: use it eagerly
// (on the host), not inside a capture.
type World struct {
	n     int
	mu    sync.Mutex
	cv    *sync.Cond
	gen   int      // rounds completed
	count int      // ranks arrived in this round
	got   [][]byte // this round's contributions
	tags  []string
	out   [][]byte // the last round's, for its ranks to read
	err   error    // a failed rank or a mismatched round
}

// NewWorld makes a world of n ≥ 1 ranks.
func NewWorld(n int) *World {
	w := &World{n: n, got: make([][]byte, n), tags: make([]string, n)}
	w.cv = sync.NewCond(&w.mu)
	return w
}

// Comm is rank r's member of the world (a nccl.ShardCollective).
func (w *World) Comm(r int) *Comm { return &Comm{w: w, rank: r} }

// Fail ends the world: ranks waiting in a collective, and later calls,
// get err (a rank that returned early would otherwise leave the others
// waiting forever).
func (w *World) Fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
	w.cv.Broadcast()
}

// Run runs f for every rank of a new world of n in a goroutine of its
// own and returns their errors joined; a rank that fails ends the world,
// so the others fail instead of waiting.
func Run(n int, f func(c *Comm) error) error {
	w := NewWorld(n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			if err := f(w.Comm(r)); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				w.Fail(errs[r])
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// exchange is one round: every rank's b, in rank order.
func (w *World) exchange(rank int, tag string, b []byte) ([][]byte, error) {
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
				w.err = fmt.Errorf("%w: stand-in collective: rank %d called %s while rank 0 called %s", nccl.ErrArg, r, t, w.tags[0])
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

// Comm is one rank of a World.
type Comm struct {
	w    *World
	rank int
}

var _ nccl.ShardCollective = (*Comm)(nil)

// Rank is this member's rank.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.w.n }

// IsSolo is false: a world's collectives always run (a world of one rank
// copies), so code paths that skip them for nccl.Solo are exercised.
func (c *Comm) IsSolo() bool { return false }

// World is the world c belongs to.
func (c *Comm) World() *World { return c.w }

// round syncs e, reads src and exchanges it under tag.
func (c *Comm) round(e *ops.Engine, tag string, src *tensor.Tensor) ([][]byte, error) {
	if err := e.Sync(); err != nil {
		return nil, err
	}
	b, err := src.Read()
	if err != nil {
		return nil, err
	}
	return c.w.exchange(c.rank, tag, b)
}

// AllReduce reduces f32 (Sum, Avg, Max, Min) and bf16 (Sum, Avg) tensors
// as NCCL does on one ring, in rank order: Avg multiplies each rank's
// value by 1/n in the dtype first (for floating-point types ncclAvg is a
// pre-multiplied sum, NCCL's ncclDevPreMulSum; exact for a power-of-two
// n), and in bf16 every operation's result is rounded to bf16, as a sum
// carried hop by hop around the ring is. dst == src reduces in place.
func (c *Comm) AllReduce(e *ops.Engine, dst, src *tensor.Tensor, op nccl.Op) error {
	if err := checkReduce("all-reduce", dst, src, op, dst.Numel()); err != nil {
		return err
	}
	all, err := c.round(e, fmt.Sprintf("all-reduce %v %v of %d", op, src.DType, src.Numel()), src)
	if err != nil {
		return err
	}
	return dst.Write(reduce(all, src.DType, op, c.w.n, 0, src.Numel()))
}

// ReduceScatter writes into dst this rank's part (elements [r·m, (r+1)·m)
// of every rank's src, m = dst's elements) of the reduction, as
// AllReduce computes it. In place when dst is that part of src.
func (c *Comm) ReduceScatter(e *ops.Engine, dst, src *tensor.Tensor, op nccl.Op) error {
	m := dst.Numel()
	if src.Numel() != c.w.n*m {
		return fmt.Errorf("%w: stand-in reduce-scatter of %d elements over %d ranks into %d", nccl.ErrArg, src.Numel(), c.w.n, m)
	}
	if err := checkReduce("reduce-scatter", dst, src, op, src.Numel()); err != nil {
		return err
	}
	all, err := c.round(e, fmt.Sprintf("reduce-scatter %v %v of %d", op, src.DType, src.Numel()), src)
	if err != nil {
		return err
	}
	return dst.Write(reduce(all, src.DType, op, c.w.n, c.rank*m, m))
}

// AllGather writes every rank's src into dst in rank order (any dtype).
// In place when src is this rank's part of dst.
func (c *Comm) AllGather(e *ops.Engine, dst, src *tensor.Tensor) error {
	if dst.DType != src.DType || dst.Numel() != c.w.n*src.Numel() {
		return fmt.Errorf("%w: stand-in all-gather of %v ×%d from %d ranks into %v ×%d", nccl.ErrArg, src.DType, src.Numel(),
			c.w.n, dst.DType, dst.Numel())
	}
	all, err := c.round(e, fmt.Sprintf("all-gather %v of %d", src.DType, src.Numel()), src)
	if err != nil {
		return err
	}
	var out []byte
	for _, b := range all {
		out = append(out, b...)
	}
	return dst.Write(out)
}

// Broadcast gives dst root's src (src nil: root's dst), any dtype.
func (c *Comm) Broadcast(e *ops.Engine, dst, src *tensor.Tensor, root int) error {
	if src == nil {
		src = dst
	}
	if root < 0 || root >= c.w.n || dst.DType != src.DType || dst.Numel() != src.Numel() {
		return fmt.Errorf("%w: stand-in broadcast from rank %d of %d, %v ×%d into %v ×%d", nccl.ErrArg, root, c.w.n,
			src.DType, src.Numel(), dst.DType, dst.Numel())
	}
	all, err := c.round(e, fmt.Sprintf("broadcast from %d %v of %d", root, src.DType, src.Numel()), src)
	if err != nil {
		return err
	}
	return dst.Write(all[root])
}

// BroadcastAll broadcasts every tensor in place from root.
func (c *Comm) BroadcastAll(e *ops.Engine, ts []*tensor.Tensor, root int) error {
	for _, t := range ts {
		if err := c.Broadcast(e, t, nil, root); err != nil {
			return err
		}
	}
	return nil
}

// Group runs fn: the stand-in's collectives are each complete when they
// return.
func (c *Comm) Group(e *ops.Engine, fn func() error) error { return fn() }

func checkReduce(what string, dst, src *tensor.Tensor, op nccl.Op, n int) error {
	ok := dst.DType == src.DType && (src.DType == tensor.F32 && (op == nccl.Sum || op == nccl.Avg || op == nccl.Max || op == nccl.Min) ||
		src.DType == tensor.BF16 && (op == nccl.Sum || op == nccl.Avg))
	if !ok || src.Numel() != n {
		return fmt.Errorf("%w: stand-in %s %v of %v ×%d into %v ×%d", nccl.ErrArg, what, op, src.DType, src.Numel(), dst.DType, dst.Numel())
	}
	return nil
}

// reduce is the reduction of elements [lo, lo+m) of every rank's bytes.
func reduce(all [][]byte, dt tensor.DType, op nccl.Op, n, lo, m int) []byte {
	round := func(x float32) float32 { return x }
	get := func(b []byte, i int) float32 { return tensor.BytesAs[float32](b)[i] }
	if dt == tensor.BF16 {
		round = func(x float32) float32 { return tensor.BF16ToF32(tensor.BF16FromF32(x)) }
		get = func(b []byte, i int) float32 { return tensor.BF16ToF32(tensor.BytesAs[uint16](b)[i]) }
	}
	scale := float32(1)
	if op == nccl.Avg {
		scale = round(1 / float32(n))
	}
	out := make([]float32, m)
	for i := range out {
		var s float32
		for r, b := range all {
			x := get(b, lo+i)
			if op == nccl.Avg {
				x = round(x * scale)
			}
			switch {
			case r == 0:
				s = x
			case op == nccl.Max:
				s = float32(math.Max(float64(s), float64(x)))
			case op == nccl.Min:
				s = float32(math.Min(float64(s), float64(x)))
			default:
				s = round(s + x)
			}
		}
		out[i] = s
	}
	if dt == tensor.BF16 {
		h := make([]uint16, m)
		for i, v := range out {
			h[i] = tensor.BF16FromF32(v)
		}
		return tensor.AsBytes(h)
	}
	return tensor.AsBytes(out)
}
