package nccl

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// Errors.
var (
	// ErrArg: a collective's tensors, root or reduction are unusable.
	ErrArg = errors.New("nccl: bad argument")
	// ErrNoGPU: several ranks were asked for on an engine without a GPU.
	ErrNoGPU = errors.New("nccl: several ranks need a GPU each")
	// ErrClosed: the communicator was closed or aborted.
	ErrClosed = errors.New("nccl: communicator closed")
)

// Comm is this process's member of a communicator: rank Rank() of Size()
// processes, one GPU each, that run collectives together (NCCL's
// ncclComm_t). Collectives take the engine whose stream they queue on and
// tensors on that engine's device: they are queued in order with the ops
// around them, the host does not wait, and inside Engine.Side or
// Engine.CommSide they go to that stream. Every rank must call the same collectives in the same
// order with the same sizes and dtypes (NCCL's rule; a mismatch hangs or
// corrupts). A communicator of one rank (Solo) needs no NCCL and works on
// the host too. Not safe for concurrent use.
type Comm struct {
	h          uintptr // ncclComm_t; 0 for Solo
	rank, size int
	dev        device.Device
	cdev       device.CUDADevice // nil for Solo

	mu     sync.Mutex
	closed bool
}

// Solo is the communicator of a job of one rank on dev: its collectives
// are copies (or nothing, in place), and it loads no library.
func Solo(dev device.Device) *Comm { return &Comm{size: 1, dev: dev} }

// Config tunes a communicator (NCCL's ncclConfig_t, "Communicator
// Configuration" in NCCL's user guide). The zero Config is NCCL's defaults;
// NCCL's environment (NCCL_MIN_CTAS, NCCL_MAX_CTAS, and the older
// NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS) overrides what is set here.
type Config struct {
	// MinCTAs and MaxCTAs bound the CTAs — thread blocks, one per
	// channel, each holding an SM while it runs — of every collective's
	// kernel (0: NCCL's choice, up to 32 on an NVLink H100). Fewer CTAs
	// leave more SMs to the computation a bucket's all-reduce overlaps
	// (the backward) at the cost of the collective's bandwidth; at least
	// 1, MinCTAs ≤ MaxCTAs where both are set.
	MinCTAs, MaxCTAs int
}

func (c Config) check() error {
	if c.MinCTAs < 0 || c.MaxCTAs < 0 || (c.MinCTAs > 0 && c.MaxCTAs > 0 && c.MinCTAs > c.MaxCTAs) {
		return fmt.Errorf("%w: CTAs between %d and %d (want ≥ 0, the minimum at most the maximum; 0 for NCCL's choice)",
			ErrArg, c.MinCTAs, c.MaxCTAs)
	}
	return nil
}

// ncclConfig is c as NCCL's config, nil for the zero Config (NCCL's
// defaults, as without one).
func (c Config) ncclConfig() *config {
	if c == (Config{}) {
		return nil
	}
	return newConfig(c.MinCTAs, c.MaxCTAs)
}

// NewComm joins the communicator of size ranks identified by id, as rank
// (ncclCommInitRankScalable with one id; it returns once every rank has
// joined). e's device is this rank's GPU; the id comes from rank 0's
// NewUniqueID. Errors: ErrArg for a rank outside [0, size), ErrNoGPU for
// a host engine, NCCL's (a CallError) otherwise; a missing or old NCCL
// gives one line naming libnccl.so.2 and GPUKIT_CUDA_PATH (or ErrTooOld).
func NewComm(e *ops.Engine, id UniqueID, rank, size int) (*Comm, error) {
	return NewCommConfig(e, id, rank, size, Config{})
}

// NewCommConfig is NewComm with cfg (every rank passes the same); ErrArg
// for a Config out of range.
func NewCommConfig(e *ops.Engine, id UniqueID, rank, size int, cfg Config) (*Comm, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("%w: rank %d of %d", ErrArg, rank, size)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cd, ok := e.Device().(device.CUDADevice)
	if !ok {
		return nil, fmt.Errorf("%w: %d ranks, but the engine is on %v", ErrNoGPU, size, e.Device())
	}
	if err := load(); err != nil {
		return nil, err
	}
	c := &Comm{rank: rank, size: size, dev: e.Device(), cdev: cd}
	err := cd.Do(func() error {
		var err error
		c.h, err = commInit(size, rank, &id, cfg.ncclConfig())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nccl: rank %d of %d joining on %v: %w", rank, size, e.Device(), err)
	}
	n, err1 := commInt(pCommCount, "ncclCommCount", c.h)
	r, err2 := commInt(pCommUserRank, "ncclCommUserRank", c.h)
	if err := errors.Join(err1, err2); err != nil {
		c.Abort()
		return nil, err
	}
	if n != size || r != rank {
		c.Abort()
		return nil, fmt.Errorf("nccl: the communicator made has rank %d of %d, want %d of %d", r, n, rank, size)
	}
	return c, nil
}

// Connect makes the communicator of the world rv describes: Solo for one
// rank; otherwise rank 0 makes a unique id, rv.Share hands it to every
// rank over TCP (MASTER_ADDR, MASTER_PORT) and every rank joins with
// NewComm on e's GPU. NCCL is loaded before the rendezvous, so a rank
// without it fails at once; rank 0 tells the other ranks when it cannot
// make the id.
func Connect(ctx context.Context, e *ops.Engine, rv *dist.Rendezvous) (*Comm, error) {
	return ConnectConfig(ctx, e, rv, Config{})
}

// ConnectConfig is Connect with every rank's communicator made with cfg
// (NewCommConfig); one rank ignores it (Solo). ErrArg for a Config out of
// range, before the rendezvous.
func ConnectConfig(ctx context.Context, e *ops.Engine, rv *dist.Rendezvous, cfg Config) (*Comm, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	w := rv.World
	if w.Size <= 1 {
		return Solo(e.Device()), nil
	}
	if _, ok := e.Device().(device.CUDADevice); !ok {
		return nil, fmt.Errorf("%w: %v, but the engine is on %v", ErrNoGPU, w, e.Device())
	}
	if err := load(); err != nil {
		return nil, err
	}
	data, err := rv.Share(ctx, "nccl", func() ([]byte, error) {
		var id UniqueID
		err := e.Do(func() error {
			var err error
			id, err = NewUniqueID()
			return err
		})
		return id[:], err
	})
	if err != nil {
		return nil, err
	}
	var id UniqueID
	if len(data) != len(id) {
		return nil, fmt.Errorf("%w: rank 0 sent a %d-byte id, want %d", dist.ErrRendezvous, len(data), len(id))
	}
	copy(id[:], data)
	return NewCommConfig(e, id, w.Rank, w.Size, cfg)
}

// Rank is this process's rank in [0, Size()).
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// Device is the device the communicator's tensors live on.
func (c *Comm) Device() device.Device { return c.dev }

// IsSolo reports whether the communicator has one rank and no NCCL.
func (c *Comm) IsSolo() bool { return c.h == 0 }

// local reports whether the collectives are copies: a job of one rank,
// with or without an NCCL communicator. NCCL is not called for one rank:
// seen on an H100 with NCCL 2.28.3, a one-rank ncclAllReduce (avg) of
// 2²⁰+3 f32 elements left every element from 2²⁰ on unwritten, and one
// rank has nothing to exchange.
func (c *Comm) local() bool { return c.size == 1 }

func (c *Comm) handle() (uintptr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	return c.h, nil
}

// stream is the stream e queues on now (exec.Engine.Stream), which inside
// Engine.Side or CommSide is that stream (the runtime swaps its stream
// there), so collectives stay in order with the ops around them.
func stream(e *ops.Engine) (cuda.Stream, error) {
	s := e.Stream()
	if s == 0 {
		return 0, fmt.Errorf("%w: the engine on %v has no CUDA stream", ErrArg, e.Device())
	}
	return s, nil
}

// check validates a collective's tensors: present, contiguous, inside
// their buffers, on e's device and the communicator's, of one supported
// dtype; it returns NCCL's dtype.
func (c *Comm) check(what string, e *ops.Engine, ts ...*tensor.Tensor) (dataType, error) {
	if !exec.SameDevice(e.Device(), c.dev) {
		return 0, fmt.Errorf("%w: %s on an engine on %v, communicator on %v", ErrArg, what, e.Device(), c.dev)
	}
	var dt tensor.DType
	for i, t := range ts {
		if t == nil || t.Buf == nil {
			return 0, fmt.Errorf("%w: %s: a tensor is missing", ErrArg, what)
		}
		if !t.Contiguous() {
			return 0, fmt.Errorf("%w: %s: %v %v is not contiguous", ErrArg, what, t.Shape, t.Strides)
		}
		if !exec.SameDevice(t.Device(), c.dev) {
			return 0, fmt.Errorf("%w: %s: a tensor on %v, communicator on %v", ErrArg, what, t.Device(), c.dev)
		}
		if t.ByteOffset()+t.Bytes() > t.Buf.Size() {
			return 0, fmt.Errorf("%w: %s: a view runs past its buffer", ErrArg, what)
		}
		if i == 0 {
			dt = t.DType
		} else if t.DType != dt {
			return 0, fmt.Errorf("%w: %s of %v into %v", ErrArg, what, t.DType, dt)
		}
	}
	nt, ok := ncclType(dt)
	if !ok {
		return 0, fmt.Errorf("%w: %s of %v", ErrArg, what, dt)
	}
	return nt, nil
}

func checkOp(what string, op Op) error {
	if _, ok := opNames[op]; !ok {
		return fmt.Errorf("%w: %s with %v", ErrArg, what, op)
	}
	return nil
}

// copySolo is a collective of one rank: dst ← src unless they are the
// same memory.
func copySolo(e *ops.Engine, dst, src *tensor.Tensor) error {
	if dst.Ptr() == src.Ptr() || dst.Numel() == 0 {
		return nil
	}
	return e.Copy(dst, src)
}

// run queues f on e's current stream inside e's Do.
func (c *Comm) run(e *ops.Engine, f func(h uintptr, s cuda.Stream) error) error {
	h, err := c.handle()
	if err != nil {
		return err
	}
	return e.Do(func() error {
		s, err := stream(e)
		if err != nil {
			return err
		}
		return f(h, s)
	})
}

func ptr(t *tensor.Tensor) cuda.DevicePtr { return cuda.DevicePtr(t.Ptr()) }

// AllReduce queues dst = op over all ranks of src (ncclAllReduce): dst and
// src of one dtype (f32, bf16, f16, i32, i64, u8) and one element count,
// any shapes; dst == src reduces in place. Avg divides the sum by Size()
// (in the dtype's arithmetic, NCCL's ncclAvg). Errors: ErrArg, ErrClosed,
// NCCL's CallError.
func (c *Comm) AllReduce(e *ops.Engine, dst, src *tensor.Tensor, op Op) error {
	dt, err := c.check("all-reduce", e, dst, src)
	if err != nil {
		return err
	}
	if err := checkOp("all-reduce", op); err != nil {
		return err
	}
	if dst.Numel() != src.Numel() {
		return fmt.Errorf("%w: all-reduce of %d elements into %d", ErrArg, src.Numel(), dst.Numel())
	}
	return c.collective(e, dst, src, dst.Numel(), func(h uintptr, s cuda.Stream) error {
		return allReduce(ptr(src), ptr(dst), dst.Numel(), dt, op, h, s)
	})
}

// Broadcast queues dst = root's src on every rank (ncclBroadcast): root's
// src is sent; other ranks' src is not read. src nil broadcasts in place
// (root's dst is sent). Errors as AllReduce, and ErrArg for a root outside
// [0, Size()).
func (c *Comm) Broadcast(e *ops.Engine, dst, src *tensor.Tensor, root int) error {
	if src == nil {
		src = dst
	}
	dt, err := c.check("broadcast", e, dst, src)
	if err != nil {
		return err
	}
	if root < 0 || root >= c.size {
		return fmt.Errorf("%w: broadcast from rank %d of %d", ErrArg, root, c.size)
	}
	if dst.Numel() != src.Numel() {
		return fmt.Errorf("%w: broadcast of %d elements into %d", ErrArg, src.Numel(), dst.Numel())
	}
	return c.collective(e, dst, src, dst.Numel(), func(h uintptr, s cuda.Stream) error {
		return broadcast(ptr(src), ptr(dst), dst.Numel(), dt, root, h, s)
	})
}

// BroadcastAll broadcasts every tensor in place from root, as one group
// (the parameters from rank 0 at the start of training).
func (c *Comm) BroadcastAll(e *ops.Engine, ts []*tensor.Tensor, root int) error {
	return c.Group(e, func() error {
		for _, t := range ts {
			if err := c.Broadcast(e, t, nil, root); err != nil {
				return err
			}
		}
		return nil
	})
}

// AllGather queues dst = the concatenation of every rank's src in rank
// order (ncclAllGather): dst has Size() × src's elements. In place when
// src is the Rank()-th part of dst. Errors as AllReduce.
func (c *Comm) AllGather(e *ops.Engine, dst, src *tensor.Tensor) error {
	dt, err := c.check("all-gather", e, dst, src)
	if err != nil {
		return err
	}
	if dst.Numel() != c.size*src.Numel() {
		return fmt.Errorf("%w: all-gather of %d elements from %d ranks into %d", ErrArg, src.Numel(), c.size, dst.Numel())
	}
	return c.collective(e, dst, src, src.Numel(), func(h uintptr, s cuda.Stream) error {
		return allGather(ptr(src), ptr(dst), src.Numel(), dt, h, s)
	})
}

// ReduceScatter queues dst = the Rank()-th part of op over all ranks of src
// (ncclReduceScatter): src has Size() × dst's elements. In place when dst
// is the Rank()-th part of src. Errors as AllReduce.
func (c *Comm) ReduceScatter(e *ops.Engine, dst, src *tensor.Tensor, op Op) error {
	dt, err := c.check("reduce-scatter", e, dst, src)
	if err != nil {
		return err
	}
	if err := checkOp("reduce-scatter", op); err != nil {
		return err
	}
	if src.Numel() != c.size*dst.Numel() {
		return fmt.Errorf("%w: reduce-scatter of %d elements over %d ranks into %d", ErrArg, src.Numel(), c.size, dst.Numel())
	}
	return c.collective(e, dst, src, dst.Numel(), func(h uintptr, s cuda.Stream) error {
		return reduceScatter(ptr(src), ptr(dst), dst.Numel(), dt, op, h, s)
	})
}

// collective queues one collective of n elements per rank by launch on
// e's stream; on one rank it is the copy of src into dst (after checking
// the communicator is open), and nothing when n is 0.
func (c *Comm) collective(e *ops.Engine, dst, src *tensor.Tensor, n int, launch func(h uintptr, s cuda.Stream) error) error {
	if c.local() {
		if _, err := c.handle(); err != nil {
			return err
		}
		return copySolo(e, dst, src)
	}
	if n == 0 {
		return nil
	}
	return c.run(e, launch)
}

// Group runs fn, whose collectives NCCL then launches together
// (ncclGroupStart and ncclGroupEnd around it, on e's device thread): fewer
// launches for many small collectives. fn must not wait for its
// collectives. ncclGroupEnd runs even when fn fails.
func (c *Comm) Group(e *ops.Engine, fn func() error) error {
	if c.local() {
		return fn()
	}
	return e.Do(func() error {
		if err := groupStart(); err != nil {
			return err
		}
		ferr := fn()
		return errors.Join(ferr, groupEnd())
	})
}

// AsyncError is the communicator's pending asynchronous error
// (ncclCommGetAsyncError): a peer that failed or went away, a network
// error; nil when none. A collective that never finishes because a peer
// died shows up here; Abort then frees the communicator.
func (c *Comm) AsyncError() error {
	h, err := c.handle()
	if err != nil || h == 0 {
		return err
	}
	return c.cdev.Do(func() error { return asyncError(h) })
}

// Close waits for the communicator's queued work and frees it
// (ncclCommFinalize, then ncclCommDestroy). Every rank closes; when a peer
// may be gone, Abort instead. A second Close or Abort does nothing.
func (c *Comm) Close() error {
	h, ok := c.take()
	if !ok || h == 0 {
		return nil
	}
	return c.cdev.Do(func() error {
		return errors.Join(call(pCommFinalize, "ncclCommFinalize", h), call(pCommDestroy, "ncclCommDestroy", h))
	})
}

// Abort frees the communicator without waiting for its work or its peers
// (ncclCommAbort): after an AsyncError, or when a peer died.
func (c *Comm) Abort() error {
	h, ok := c.take()
	if !ok || h == 0 {
		return nil
	}
	return c.cdev.Do(func() error { return call(pCommAbort, "ncclCommAbort", h) })
}

func (c *Comm) take() (uintptr, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, false
	}
	c.closed = true
	return c.h, true
}
