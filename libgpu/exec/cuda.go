package exec

import (
	"errors"
	"fmt"
	"sync"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
)

// ErrCaptureAlloc: the CUDA backend needed a scratch buffer larger than any
// it had while its stream was capturing, where allocation is not allowed.
// Run the captured sequence once eagerly before capturing it.
var ErrCaptureAlloc = errors.New("exec: CUDA backend must allocate scratch memory during a stream capture (run the step once eagerly before capturing)")

// WorkspaceSize is the cuBLASLt workspace of each of the backend's streams
// (32 MiB, what the heuristic assumes in libgpu/cuda's Candidates; Hopper
// kernels use up to that).
const WorkspaceSize = 32 << 20

// CUDA is the CUDA backend: everything is queued on its own non-blocking
// stream (or, inside Side and CommSide, on a side stream) with no host
// synchronisation, so a whole step can be captured into one CUDA graph.
// Outputs are ready when the stream is synchronised (Engine.Sync, an
// Event). Its methods that touch the device run inside Do (Engine.Dispatch
// calls gpu there).
//
// Scratch buffers are allocated on first need and grown, never shrunk; a
// buffer outgrown is kept until Close, because a graph captured earlier may
// still use it. Not safe for concurrent use (the Engine is not either).
type CUDA struct {
	states
	dev    device.CUDADevice
	stream cuda.Stream
	lt     *cuda.LtHandle
	ws     cuda.DevicePtr
	// solver is the cuSOLVER handle, made on first use (Solver).
	solver *cuda.SolverHandle

	kc kernelCache

	// side is the side stream (side.go), made on the first Engine.Side.
	side sideState
	// comm is the communication stream (Engine.CommSide); highComm: made
	// with the context's greatest priority (Options.HighPriorityComm).
	comm     sideState
	highComm bool
	// while is Engine.While's condition kernel and body streams (while.go).
	while whileState
	// lanes are Lanes' streams per origin stream (lanes.go).
	lanes laneState

	mu      sync.Mutex
	scratch map[string]scratchBuf
	retired []cuda.DevicePtr
	closed  bool
	// zeroed: how many leading u32 of a scratch buffer are known zero
	// (ticket counters, which kernels leave zero; Tickets).
	zeroed map[cuda.DevicePtr]int
	// sms is the device's multiprocessor count (0 until SMCount reads it);
	// resident caches ResidentGrid's answers.
	sms      int
	resident map[residentKey]int
}

type scratchBuf struct {
	p    cuda.DevicePtr
	size int64
}

func newCUDA(dev device.CUDADevice, opts Options) (*CUDA, error) {
	c := &CUDA{dev: dev, scratch: map[string]scratchBuf{}, highComm: opts.HighPriorityComm, lanes: laneState{cur: -1}}
	err := dev.Do(func() error {
		var err error
		if c.stream, err = cuda.StreamCreate(true); err != nil {
			return err
		}
		if c.lt, err = cuda.LtCreate(); err != nil {
			return err
		}
		c.ws, err = cuda.MemAlloc(WorkspaceSize)
		return err
	})
	if err != nil {
		c.close()
		return nil, fmt.Errorf("exec: CUDA backend on %v: %w", dev, err)
	}
	return c, nil
}

// Device is the backend's device.
func (c *CUDA) Device() device.CUDADevice { return c.dev }

// Do runs f on the device's thread with its context current.
func (c *CUDA) Do(f func() error) error { return c.dev.Do(f) }

// Stream is the stream work is queued on now: the engine's, or inside
// Side, CommSide or a While body being captured, that one.
func (c *CUDA) Stream() cuda.Stream { return c.stream }

// Lt is the cuBLASLt handle.
func (c *CUDA) Lt() *cuda.LtHandle { return c.lt }

// Workspace is the cuBLASLt workspace of the current stream and its size
// (WorkspaceSize bytes): a GEMM on a side stream uses that stream's own.
// Inside Lanes there is none, and it fails with ErrSide: a GEMM must not
// be queued there.
func (c *CUDA) Workspace() (cuda.DevicePtr, int64, error) {
	if c.lanes.set != nil {
		return 0, 0, fmt.Errorf("%w: a GEMM inside Lanes (no cuBLASLt workspace there)", ErrSide)
	}
	return c.ws, WorkspaceSize, nil
}

// Solver is the cuSOLVER handle, made on first use and destroyed by Close;
// inside Lanes, the lane's own. Inside Do.
func (c *CUDA) Solver() (*cuda.SolverHandle, error) {
	if c.lanes.set != nil {
		return c.laneSolver()
	}
	if c.solver == nil {
		h, err := cuda.SolverCreate()
		if err != nil {
			return nil, fmt.Errorf("exec: cuSOLVER: %w", err)
		}
		c.solver = h
	}
	return c.solver, nil
}

// IsCapturing reports whether the current stream is being captured.
// Inside Do.
func (c *CUDA) IsCapturing() (bool, error) { return c.stream.IsCapturing() }

// close waits for the streams, then frees the workspaces and scratch
// buffers, closes the family states and destroys the streams and library
// handles. A second close does nothing.
func (c *CUDA) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	return c.dev.Do(func() error {
		var first error
		keep := func(err error) {
			if err != nil && first == nil {
				first = err
			}
		}
		for _, s := range []*sideState{&c.side, &c.comm} {
			if s.on {
				c.stream, c.ws = s.main, s.mainWS
			}
		}
		c.lanesClose(keep)
		c.sideClose(keep)
		c.whileClose(keep)
		if c.stream != 0 {
			keep(c.stream.Synchronize())
		}
		c.closeStates(c, keep)
		c.mu.Lock()
		for _, s := range c.scratch {
			keep(cuda.MemFree(s.p))
		}
		for _, p := range c.retired {
			keep(cuda.MemFree(p))
		}
		c.scratch, c.retired = nil, nil
		c.mu.Unlock()
		if c.ws != 0 {
			keep(cuda.MemFree(c.ws))
		}
		if c.lt != nil {
			keep(c.lt.Destroy())
		}
		if c.solver != nil {
			keep(c.solver.Destroy())
		}
		if c.stream != 0 {
			keep(c.stream.Destroy())
		}
		return first
	})
}

// Scratch returns a device buffer of at least n bytes for purpose name on
// the current stream (the side and communication streams have scratch of
// their own), growing it (by at least half) when it is too small; growing
// fails with ErrCaptureAlloc while the stream is being captured. Inside
// Do.
func (c *CUDA) Scratch(name string, n int64) (cuda.DevicePtr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, fmt.Errorf("%w: %v", device.ErrClosed, c.dev)
	}
	name = c.sideScratch(name)
	s := c.scratch[name]
	if s.size >= n {
		return s.p, nil
	}
	if capturing, err := c.stream.IsCapturing(); err != nil || capturing {
		if err == nil {
			err = ErrCaptureAlloc
		}
		return 0, fmt.Errorf("exec: scratch %q of %d bytes: %w", name, n, err)
	}
	size := device.RoundUp(max(n, s.size+s.size/2), 256)
	p, err := cuda.MemAlloc(size)
	if err != nil {
		return 0, fmt.Errorf("exec: scratch %q of %d bytes: %w", name, size, err)
	}
	if s.p != 0 {
		c.retired = append(c.retired, s.p)
	}
	c.scratch[name] = scratchBuf{p: p, size: size}
	return p, nil
}

// Tickets returns a scratch array of n u32 ticket counters for purpose
// name, all zero when the next kernel on the stream runs: zeroed (on the
// stream) when the buffer is new or longer than before; the kernels that
// use tickets leave them zero. Inside Do.
func (c *CUDA) Tickets(name string, n int) (cuda.DevicePtr, error) {
	p, err := c.Scratch(name, int64(4*n))
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	done := c.zeroed[p]
	c.mu.Unlock()
	if done >= n {
		return p, nil
	}
	if err := cuda.MemsetD32Async(p, 0, int64(n), c.stream); err != nil {
		return 0, fmt.Errorf("exec: zeroing %s: %w", name, err)
	}
	c.mu.Lock()
	if c.zeroed == nil {
		c.zeroed = map[cuda.DevicePtr]int{}
	}
	c.zeroed[p] = n
	c.mu.Unlock()
	return p, nil
}
