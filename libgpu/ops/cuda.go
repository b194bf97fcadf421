package ops

import (
	"errors"
	"fmt"
	"sync"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/device"
	"gpukit/libgpu/kernels"
	"gpukit/libgpu/kernels/launch"
)

func init() {
	Register(device.KindCUDA, newCUDAImpl)
}

// Streamer is implemented by backends that queue their work on one CUDA
// stream (the CUDA backend): a caller captures a whole training step into a
// CUDA graph by capturing this stream (Stream.BeginCapture before the ops,
// EndCapture after), then replays it with GraphExec.Launch on the same
// stream. Reach it with e.Impl().(ops.Streamer).
type Streamer interface {
	Stream() cuda.Stream
}

// ErrCaptureAlloc: the CUDA backend needed a scratch buffer larger than any
// it had while its stream was capturing, where allocation is not allowed.
// Run the captured sequence once eagerly before capturing it.
var ErrCaptureAlloc = errors.New("ops: CUDA backend must allocate scratch memory during a stream capture (run the step once eagerly before capturing)")

// cudaFusion says whether engines made from now on use cuBLASLt's fused
// epilogues (the default) or the unfused path; only tests change it.
var cudaFusion = true

// cudaWorkspace is the cuBLASLt workspace (32 MiB, what the heuristic
// assumes in libgpu/cuda's Candidates; Hopper kernels use up to that).
const cudaWorkspace = 32 << 20

// cudaImpl is the CUDA backend: cuBLASLt GEMMs with fused epilogues and
// NVRTC kernels from libgpu/kernels/ops_*.cu, all queued on the impl's own
// non-blocking stream with no host synchronisation inside an op, so a whole
// step can be captured into one CUDA graph. Outputs are ready when the
// device (or the stream) is synchronised; device.CUDA's CopyOut and Sync do
// that.
//
// Scratch buffers (bf16 casts of GEMM operands, dz, column-sum partials,
// per-row losses) are allocated on first need and grown, never shrunk; a
// buffer outgrown is kept until Close, because a graph captured earlier may
// still use it. Not safe for concurrent use (the Engine is not either).
type cudaImpl struct {
	dev    device.CUDADevice
	prec   Precision
	stream cuda.Stream
	lt     *cuda.LtHandle
	ws     cuda.DevicePtr

	// Small fixed device state: the cross-entropy ticket counter (u32, zero
	// between launches) and AdamW's bias corrections (2 × f32).
	counter cuda.DevicePtr
	bc      cuda.DevicePtr

	kc    kernelCache
	tuner gemmTuner

	// noFuse turns off every cuBLASLt epilogue: GEMMs store the plain
	// product and NVRTC kernels add bias, activation and bias gradients.
	// Tests compare both paths with the reference.
	noFuse bool
	// rejected records GEMM specs whose fused epilogue cuBLASLt refused
	// (no algorithm or not supported for the types); they take the
	// unfused path from then on without asking again.
	rejected map[cuda.GemmSpec]error

	// side is the side stream (side.go), made on the first Engine.Side.
	side sideState
	// comm is the communication stream (Engine.CommSide); highComm: made
	// with the context's greatest priority (Options.HighPriorityComm).
	comm     sideState
	highComm bool
	// solver is the cuSOLVER handle of the eigensolver (matroot.go), made
	// on first use; noBatchedEigh: its library has no batched solver.
	solver        *cuda.SolverHandle
	noBatchedEigh bool
	// attnWGS caches whether attention's wgmma kernels run (attention.go).
	attnWGS attnWGState
	// while is Engine.While's condition kernel and body streams (while.go).
	while whileState
	// ggWG caches whether the grouped GEMM's wgmma kernels exist (groupedgemm.go).
	ggWG ggHopperState

	mu      sync.Mutex
	scratch map[string]scratchBuf
	retired []cuda.DevicePtr
	closed  bool
	// zeroed: how many leading u32 of a scratch buffer are known zero
	// (ticket counters, which kernels leave zero; ticketPtr).
	zeroed map[cuda.DevicePtr]int
	// sms is the device's multiprocessor count (0 until smCount reads it);
	// resident caches residentGrid's answers.
	sms      int
	resident map[residentKey]int
}

type scratchBuf struct {
	p    cuda.DevicePtr
	size int64
}

var _ Streamer = (*cudaImpl)(nil)

// newCUDAImpl is the constructor registered for device.KindCUDA. dev must
// implement device.CUDADevice (device.CUDA does). Kernels are compiled
// (or read from the kernel cache) when first launched or prefetched.
func newCUDAImpl(dev device.Device, opts Options) (Impl, error) {
	cd, ok := dev.(device.CUDADevice)
	if !ok {
		return nil, fmt.Errorf("%w: %v does not expose a CUDA context", ErrNoBackend, dev)
	}
	if opts.Precision > PrecBF16 {
		return nil, fmt.Errorf("%w: precision %d", ErrConfig, opts.Precision)
	}
	c := &cudaImpl{dev: cd, prec: opts.Precision, scratch: map[string]scratchBuf{},
		rejected: map[cuda.GemmSpec]error{}, noFuse: !cudaFusion, highComm: opts.HighPriorityComm}
	err := cd.Do(func() error {
		var err error
		if c.stream, err = cuda.StreamCreate(true); err != nil {
			return err
		}
		if c.lt, err = cuda.LtCreate(); err != nil {
			return err
		}
		if c.ws, err = cuda.MemAlloc(cudaWorkspace); err != nil {
			return err
		}
		if c.counter, err = cuda.MemAlloc(256); err != nil {
			return err
		}
		// On the impl's stream: a synchronous memset of device memory may
		// still be running when the host returns, unordered with a
		// non-blocking stream.
		if err := cuda.MemsetD32Async(c.counter, 0, 64, c.stream); err != nil {
			return err
		}
		c.bc = c.counter.Add(128)
		return nil
	})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("ops: CUDA backend on %v: %w", dev, err)
	}
	return c, nil
}

// kernelCompiler is the process's compiler of embedded kernels for c's
// context.
func kernelCompiler(c *cudaImpl) (*kernels.DeviceCompiler, error) {
	return kernels.ForContext(c.dev.Context())
}

// Stream is the stream every op of this backend is queued on.
func (c *cudaImpl) Stream() cuda.Stream { return c.stream }

// Close waits for the stream, then frees the workspace and scratch buffers
// and destroys the stream and the cuBLASLt handle. Graphs captured from the
// stream must not be launched afterwards. A second Close does nothing.
func (c *cudaImpl) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
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
		c.sideClose(keep)
		c.whileClose(keep)
		if c.stream != 0 {
			keep(c.stream.Synchronize())
		}
		for _, s := range c.scratch {
			keep(cuda.MemFree(s.p))
		}
		for _, p := range c.retired {
			keep(cuda.MemFree(p))
		}
		for _, p := range []cuda.DevicePtr{c.ws, c.counter} {
			if p != 0 {
				keep(cuda.MemFree(p))
			}
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

// scratchPtr returns a device buffer of at least n bytes for purpose name,
// growing it (by at least half) when it is too small. Must run inside Do.
func (c *cudaImpl) scratchPtr(name string, n int64) (cuda.DevicePtr, error) {
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
		return 0, fmt.Errorf("ops: scratch %q of %d bytes: %w", name, n, err)
	}
	size := device.RoundUp(max(n, s.size+s.size/2), 256)
	p, err := cuda.MemAlloc(size)
	if err != nil {
		return 0, fmt.Errorf("ops: scratch %q of %d bytes: %w", name, size, err)
	}
	if s.p != 0 {
		c.retired = append(c.retired, s.p)
	}
	c.scratch[name] = scratchBuf{p: p, size: size}
	return p, nil
}

// gridFor is the 1-D grid of a grid-stride kernel over n elements with
// blocks of bs threads, capped at 65535 blocks (the loop covers the rest).
func gridFor(n int64, bs int64) [3]uint32 {
	g := (n + bs - 1) / bs
	g = min(max(g, 1), 65535)
	return [3]uint32{uint32(g), 1, 1}
}

// castBF16 queues the f32 → bf16 rounding of n elements at src into the
// scratch slot and returns the bf16 copy.
func (c *cudaImpl) castBF16(slot string, src cuda.DevicePtr, n int64) (cuda.DevicePtr, error) {
	dst, err := c.scratchPtr(slot, 2*n)
	if err != nil {
		return 0, err
	}
	return dst, launch.CastF32Bf16(c, gridFor(n, 256), [3]uint32{256, 1, 1}, 0, dst, src, n)
}
