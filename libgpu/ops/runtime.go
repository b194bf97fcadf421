package ops

import (
	"errors"
	"fmt"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// The engine's run-time API: what a tool needs besides ops to drive a
// device — running on the device's thread, capturing a sequence of ops as
// a graph and replaying it, events, pinned staging memory and copies
// queued in order with the ops. Every call works on every backend: on the
// host, work runs when it is queued, a "graph" replays its function, an
// event is always complete and staging memory is ordinary memory.

// Do runs f on the device's thread with its context current (CUDA; the
// host just calls f). Wrap a sequence of ops in one Do to keep them on one
// OS thread (stream capture needs that).
func (e *Engine) Do(f func() error) error {
	if c, ok := e.impl.(*cudaImpl); ok {
		return c.dev.Do(f)
	}
	return f()
}

// Sync waits until everything queued on the engine has finished.
func (e *Engine) Sync() error {
	if c, ok := e.impl.(*cudaImpl); ok {
		return c.dev.Do(c.stream.Synchronize)
	}
	return nil
}

// IsGraphCapable reports whether Capture records a device graph (CUDA)
// rather than a function replayed eagerly (host).
func (e *Engine) IsGraphCapable() bool {
	_, ok := e.impl.(*cudaImpl)
	return ok
}

// CapturedGraph is a captured sequence of ops: a CUDA graph on a GPU, the
// function itself on the host. Launch replays it; Close frees it.
type CapturedGraph struct {
	e     *Engine
	f     func() error
	graph cuda.Graph
	exec  cuda.GraphExec
}

// ErrCapture wraps failures to capture or replay a graph.
var ErrCapture = errors.New("ops: graph capture")

// Capture records every op f queues on the engine into a graph without
// running it (CUDA stream capture in thread-local mode, on one pinned
// thread). Ops must have run once eagerly with the same shapes first, so
// that scratch buffers, kernels and GEMM algorithms exist: allocation and
// compilation are not allowed while capturing. On the host, Capture keeps
// f and Launch calls it.
func (e *Engine) Capture(f func() error) (*CapturedGraph, error) {
	c, ok := e.impl.(*cudaImpl)
	if !ok {
		return &CapturedGraph{e: e, f: f}, nil
	}
	g := &CapturedGraph{e: e}
	err := c.dev.Do(func() error {
		if err := c.stream.BeginCapture(cuda.CaptureModeThreadLocal); err != nil {
			return err
		}
		ferr := f()
		graph, err := c.stream.EndCapture()
		if ferr != nil {
			if err == nil {
				graph.Destroy()
			}
			return ferr
		}
		if err != nil {
			return err
		}
		exec, err := graph.Instantiate()
		if err != nil {
			graph.Destroy()
			return err
		}
		g.graph, g.exec = graph, exec
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCapture, err)
	}
	return g, nil
}

// Launch replays the graph on the engine's stream (queued; Sync or an
// event waits for it).
func (g *CapturedGraph) Launch() error {
	if g.exec == 0 {
		if g.f == nil {
			return fmt.Errorf("%w: graph closed", ErrCapture)
		}
		return g.f()
	}
	c := g.e.impl.(*cudaImpl)
	return c.dev.Do(func() error { return g.exec.Launch(c.stream) })
}

// Close frees the graph. Launch fails afterwards.
func (g *CapturedGraph) Close() error {
	g.f = nil
	if g.exec == 0 {
		return nil
	}
	c := g.e.impl.(*cudaImpl)
	err := c.dev.Do(func() error {
		return errors.Join(g.exec.Destroy(), g.graph.Destroy())
	})
	g.exec, g.graph = 0, 0
	return err
}

// Event marks a point in the engine's queue.
type Event struct {
	e  *Engine
	ev cuda.Event
}

// NewEvent returns an event; timing events can measure elapsed time
// between two of them (Elapsed).
func (e *Engine) NewEvent(timing bool) (*Event, error) {
	c, ok := e.impl.(*cudaImpl)
	if !ok {
		return &Event{e: e}, nil
	}
	flags := cuda.EventDisableTiming
	if timing {
		flags = cuda.EventDefault
	}
	var ev cuda.Event
	err := c.dev.Do(func() error {
		var err error
		ev, err = cuda.EventCreate(flags)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Event{e: e, ev: ev}, nil
}

// Record marks the current end of the engine's queue.
func (v *Event) Record() error {
	if v.ev == 0 {
		return nil
	}
	c := v.e.impl.(*cudaImpl)
	return c.dev.Do(func() error { return v.ev.Record(c.stream) })
}

// Wait blocks until the work queued before the last Record has finished.
func (v *Event) Wait() error {
	if v.ev == 0 {
		return nil
	}
	return v.e.Do(v.ev.Synchronize)
}

// Elapsed is the time in milliseconds from start's record to v's (both
// timing events, both complete); 0 on the host.
func (v *Event) Elapsed(start *Event) (float32, error) {
	if v.ev == 0 || start.ev == 0 {
		return 0, nil
	}
	var ms float32
	err := v.e.Do(func() error {
		var err error
		ms, err = cuda.EventElapsed(start.ev, v.ev)
		return err
	})
	return ms, err
}

// Close frees the event.
func (v *Event) Close() error {
	if v.ev == 0 {
		return nil
	}
	err := v.e.Do(v.ev.Destroy)
	v.ev = 0
	return err
}

// Staging is host memory for copies queued on the engine: page-locked on a
// GPU (so copies run asynchronously, overlapping host work), ordinary
// memory on the host.
type Staging struct {
	e    *Engine
	p    unsafe.Pointer
	b    []byte
	host bool
}

// NewStaging allocates n bytes of staging memory.
func (e *Engine) NewStaging(n int64) (*Staging, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: staging of %d bytes", device.ErrBadSize, n)
	}
	c, ok := e.impl.(*cudaImpl)
	if !ok {
		words := make([]uint64, (n+7)/8)
		return &Staging{e: e, b: tensor.AsBytes(words)[:n], host: true}, nil
	}
	s := &Staging{e: e}
	err := c.dev.Do(func() error {
		p, err := cuda.MemHostAlloc(n)
		s.p = p
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("ops: pinned staging of %d bytes: %w", n, err)
	}
	s.b = unsafe.Slice((*byte)(s.p), n)
	return s, nil
}

// Bytes is the staging memory.
func (s *Staging) Bytes() []byte { return s.b }

// Close frees the staging memory.
func (s *Staging) Close() error {
	if s.host || s.p == nil {
		s.b = nil
		return nil
	}
	err := s.e.Do(func() error { return cuda.MemFreeHost(s.p) })
	s.p, s.b = nil, nil
	return err
}

// CopyIn queues the copy of dst.Bytes() bytes from s at byte offset off
// into the contiguous tensor dst, in order with the engine's ops (on the
// host it copies at once). The staging memory must not be rewritten until
// the copy has run (record an event after it and wait for it).
func (e *Engine) CopyIn(dst *tensor.Tensor, s *Staging, off int64) error {
	if err := e.checkCopy("copy-in destination", dst, s, off); err != nil {
		return err
	}
	src := s.b[off : off+dst.Bytes()]
	c, ok := e.impl.(*cudaImpl)
	if !ok {
		return dst.Write(src)
	}
	return c.dev.Do(func() error {
		return cuda.MemcpyHtoDAsync(devPtr(dst), unsafe.Pointer(&src[0]), dst.Bytes(), c.stream)
	})
}

// CopyOut queues the copy of the contiguous tensor src into s at byte
// offset off, in order with the engine's ops; read s after an event
// recorded behind it has completed (on the host it copies at once).
func (e *Engine) CopyOut(s *Staging, off int64, src *tensor.Tensor) error {
	if err := e.checkCopy("copy-out source", src, s, off); err != nil {
		return err
	}
	dst := s.b[off : off+src.Bytes()]
	c, ok := e.impl.(*cudaImpl)
	if !ok {
		b, err := src.Read()
		copy(dst, b)
		return err
	}
	return c.dev.Do(func() error {
		return cuda.MemcpyDtoHAsync(unsafe.Pointer(&dst[0]), devPtr(src), src.Bytes(), c.stream)
	})
}

func (e *Engine) checkCopy(what string, t *tensor.Tensor, s *Staging, off int64) error {
	if t == nil || s == nil || s.b == nil {
		return fmt.Errorf("%w: %s: missing tensor or staging", tensor.ErrShape, what)
	}
	if err := e.checkPlace(what, t); err != nil {
		return err
	}
	if off < 0 || off+t.Bytes() > int64(len(s.b)) || t.Bytes() == 0 {
		return fmt.Errorf("%w: %s of %d bytes at offset %d of %d staging bytes", device.ErrRange, what, t.Bytes(), off, len(s.b))
	}
	return nil
}

// Copy queues dst ← src for two contiguous tensors of the same dtype and
// size on the engine's device, in order with the ops.
func (e *Engine) Copy(dst, src *tensor.Tensor) error {
	if err := e.checkPlace("copy destination", dst); err != nil {
		return err
	}
	if err := e.checkPlace("copy source", src); err != nil {
		return err
	}
	if dst.DType != src.DType || dst.Bytes() != src.Bytes() {
		return fmt.Errorf("%w: copy %v %v into %v %v", tensor.ErrShape, src.DType, src.Shape, dst.DType, dst.Shape)
	}
	if dst.Bytes() == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		b, err := src.Read()
		if err != nil {
			return err
		}
		return dst.Write(b)
	}, func(c *cudaImpl) error {
		return cuda.MemcpyDtoDAsync(devPtr(dst), devPtr(src), dst.Bytes(), c.stream)
	})
}
