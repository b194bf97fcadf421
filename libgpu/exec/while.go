package exec

// Data-dependent loops that stay on the GPU: Engine.While runs a body of
// ops while a flag on the device says so. Inside Engine.Capture on CUDA the
// loop becomes a conditional WHILE node of the captured graph (CUDA 12.4+
// drivers; CUDA Programming Guide, "Conditional Graph Nodes"): the body is
// captured once into the node's body graph, and a one-thread kernel
// (libgpu/kernels/graphwhile.cu while_set) sets the node's condition from
// the flag before the first run and after every run, so a replayed graph
// runs as many iterations as the data asks with no host round trip.
// Outside a capture, on CUDA, the loop runs on the host, reading the flag
// after each run (a synchronisation per iteration); on the host backend
// it runs on the host, so the same code runs in CI. HRM's evaluation halts
// this way (DESIGN.md: "HRM's halting loop is a conditional (WHILE) node").

import (
	"errors"
	"fmt"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// whileState is the CUDA backend's state for While: the kernel that sets
// the condition (compiled on the first eager While: kernels may not
// compile during a capture), and one stream per nesting depth into which
// bodies are captured (a capturing stream cannot begin a second capture).
type whileState struct {
	fn      cuda.Function
	module  cuda.Module // the PTX fallback's module, when used
	streams []cuda.Stream
	depth   int
}

// ErrWhile wraps While's failures to build a conditional node (a driver
// older than CUDA 12.4, or a body the node refuses: body graphs hold only
// kernels, memsets, device memcopies and nested graphs).
var ErrWhile = errors.New("exec: while loop")

// While runs body repeatedly while the i32 scalar cond (one element, on
// the engine's device) is non-zero: cond is read before the first run and
// after every run, so body must update it (typically its last op,
// ops.Engine.CountAbove over the sequences still running). With
// maxIter > 0 the loop also stops after maxIter runs. count, when not nil (an i32 scalar on the
// device), receives the number of runs completed: 0 before the first, then
// 1, 2, ... — it is required when maxIter > 0 (the limit is checked
// against it on the device).
//
// Inside Engine.Capture on CUDA the loop is one conditional WHILE node of
// the captured graph and body is called once, to capture the loop body;
// every replay of the graph then runs the loop on the device as long as
// the data asks. The body's ops must be ones a conditional body may hold
// (kernels, GEMMs, memsets, device copies, nested While loops: no host
// work, no event records), and, as for any capture, must have run eagerly
// once first (run the whole step eagerly, While included, before
// capturing it). Outside a capture body is called once per iteration, and
// on CUDA the host waits for the device after each run to read cond.
//
// Errors: tensor.ErrShape or tensor.ErrDType for cond and count,
// ErrConfig (maxIter > 0 without count, maxIter < 0), ErrSide (inside
// Engine.Side), ErrWhile wrapping the driver's error when the conditional
// node cannot be made, or body's error.
func (e *Engine) While(cond, count *tensor.Tensor, maxIter int, body func() error) error {
	if err := e.CheckScalar("while cond", cond, tensor.I32); err != nil {
		return err
	}
	if count != nil {
		if err := e.CheckScalar("while count", count, tensor.I32); err != nil {
			return err
		}
	}
	if maxIter < 0 || (maxIter > 0 && count == nil) {
		return fmt.Errorf("%w: while with maxIter %d and count %v (a limit needs a count tensor)", ErrConfig, maxIter, count)
	}
	if body == nil {
		return fmt.Errorf("%w: while without a body", ErrConfig)
	}
	c := e.cuda
	if c == nil {
		return e.whileLoop(cond, count, maxIter, body)
	}
	if c.OnSide() {
		return fmt.Errorf("%w: While inside Side or CommSide", ErrSide)
	}
	var capturing bool
	if err := c.Do(func() error {
		var err error
		capturing, err = c.stream.IsCapturing()
		return err
	}); err != nil {
		return err
	}
	if !capturing {
		return e.whileEager(c, cond, count, maxIter, body)
	}
	return c.Do(func() error { return c.whileCapture(cond, count, maxIter, body) })
}

// readI32 waits for the engine and reads an i32 scalar.
func (e *Engine) readI32(t *tensor.Tensor) (int32, error) {
	if err := e.Sync(); err != nil {
		return 0, err
	}
	b, err := t.Read()
	if err != nil {
		return 0, err
	}
	return tensor.BytesAs[int32](b)[0], nil
}

// whileLoop is the loop on the host: the host backend's, and the CUDA
// backend's outside a capture.
func (e *Engine) whileLoop(cond, count *tensor.Tensor, maxIter int, body func() error) error {
	if count != nil {
		if err := e.Fill(count, 0); err != nil {
			return err
		}
	}
	for n := 0; maxIter == 0 || n < maxIter; n++ {
		v, err := e.readI32(cond)
		if err != nil {
			return err
		}
		if v == 0 {
			return nil
		}
		if err := body(); err != nil {
			return err
		}
		if count != nil {
			if err := e.Fill(count, float64(n+1)); err != nil {
				return err
			}
		}
	}
	return nil
}

// whileEager runs the loop on the host for the CUDA backend, and prepares
// what a capture of the same loop needs: the condition kernel and a body
// stream for this nesting depth.
func (e *Engine) whileEager(c *CUDA, cond, count *tensor.Tensor, maxIter int, body func() error) error {
	if err := c.Do(func() error {
		if _, err := c.whileKernel(); err != nil {
			return err
		}
		_, err := c.whileStream(c.while.depth)
		return err
	}); err != nil {
		return err
	}
	c.while.depth++
	defer func() { c.while.depth-- }()
	return e.whileLoop(cond, count, maxIter, body)
}

// whileKernel returns while_set, compiling it on first use: as a cubin like
// every embedded kernel, or, should NVRTC's own assembler not resolve
// cudaGraphSetConditional, as PTX for the driver to JIT (how NeMo loads
// its condition kernels). Inside Do.
func (c *CUDA) whileKernel() (cuda.Function, error) {
	if c.while.fn != 0 {
		return c.while.fn, nil
	}
	f, err := c.Function(launch.WhileSetKernel)
	if err != nil {
		if capturing, cerr := c.stream.IsCapturing(); cerr == nil && capturing {
			return 0, err
		}
		d, derr := c.Compiler()
		if derr != nil {
			return 0, errors.Join(err, derr)
		}
		src, serr := kernels.Embedded(launch.WhileSetKernel.File)
		if serr != nil {
			return 0, errors.Join(err, serr)
		}
		res, perr := d.Compile(src, kernels.Options{Arch: d.Arch(), PTX: true})
		if perr != nil {
			return 0, fmt.Errorf("%w: the condition kernel compiles neither to a cubin (%v) nor to PTX (%v)", ErrWhile, err, perr)
		}
		m, lerr := cuda.ModuleLoadData(res.PTX)
		if lerr != nil {
			return 0, fmt.Errorf("%w: the condition kernel: cubin: %v; PTX: %v", ErrWhile, err, lerr)
		}
		if f, err = m.Function(launch.WhileSetKernel.Name); err != nil {
			return 0, fmt.Errorf("%w: %v", ErrWhile, err)
		}
		c.while.module = m
	}
	c.while.fn = f
	return f, nil
}

// whileStream returns the body stream of nesting depth d, creating it when
// missing (eager runs create them; a capture reuses them). Inside Do.
func (c *CUDA) whileStream(d int) (cuda.Stream, error) {
	for len(c.while.streams) <= d {
		s, err := cuda.StreamCreate(true)
		if err != nil {
			return 0, fmt.Errorf("%w: body stream: %v", ErrWhile, err)
		}
		c.while.streams = append(c.while.streams, s)
	}
	return c.while.streams[d], nil
}

// whileSet queues while_set on the current stream.
func (c *CUDA) whileSet(f cuda.Function, h cuda.GraphConditionalHandle, cond, count *tensor.Tensor, maxIter int, first bool) error {
	err := launch.WhileSet(fnLauncher{f, c.stream}, [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0,
		uint64(h), devPtr(cond), devPtr(count), int32(maxIter), launch.Bool(first))
	if err != nil {
		return fmt.Errorf("exec: launch while_set: %w", err)
	}
	return nil
}

// fnLauncher launches the one function f on stream s, whatever kernel it
// is asked for (while_set, loaded from a PTX module when its cubin would
// not load).
type fnLauncher struct {
	f cuda.Function
	s cuda.Stream
}

func (l fnLauncher) Launch(_ launch.Kernel, grid, block [3]uint32, smem uint32, args ...unsafe.Pointer) error {
	return cuda.LaunchKernel(l.f, grid, block, smem, l.s, args...)
}

// whileCapture builds the conditional node in the current capture (on
// c.stream), as NVIDIA's NeMo does (with_conditional_node): a handle on the
// capture's graph, while_set before the node, the node after it as the
// capture's new dependency, and the body captured into the node's body
// graph from the body stream of this depth, ending with while_set. Inside
// Do.
func (c *CUDA) whileCapture(cond, count *tensor.Tensor, maxIter int, body func() error) error {
	f, err := c.whileKernel()
	if err != nil {
		return err
	}
	bs, err := c.whileStream(c.while.depth)
	if err != nil {
		return err
	}
	ctx := c.dev.Context()
	info, err := c.stream.CaptureInfo()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrWhile, err)
	}
	h, err := info.Graph.ConditionalHandleCreate(ctx, 0, true)
	if err != nil {
		return fmt.Errorf("%w: conditional handle: %v", ErrWhile, err)
	}
	if err := c.whileSet(f, h, cond, count, maxIter, true); err != nil {
		return err
	}
	if info, err = c.stream.CaptureInfo(); err != nil {
		return fmt.Errorf("%w: %v", ErrWhile, err)
	}
	node, bodies, err := info.Graph.AddConditionalNode(info.Deps, info.Edges, h, cuda.GraphCondWhile, 1, ctx)
	if err != nil {
		return fmt.Errorf("%w: conditional node: %v", ErrWhile, err)
	}
	if err := c.stream.SetCaptureDependencies([]cuda.GraphNode{node}); err != nil {
		return fmt.Errorf("%w: %v", ErrWhile, err)
	}
	if err := bs.BeginCaptureToGraph(bodies[0], cuda.CaptureModeThreadLocal); err != nil {
		return fmt.Errorf("%w: body capture: %v", ErrWhile, err)
	}
	main := c.stream
	c.stream = bs
	c.while.depth++
	berr := body()
	if berr == nil {
		berr = c.whileSet(f, h, cond, count, maxIter, false)
	}
	c.stream = main
	c.while.depth--
	if _, err := bs.EndCapture(); err != nil && berr == nil {
		berr = fmt.Errorf("%w: body capture: %v", ErrWhile, err)
	}
	return berr
}

// whileClose destroys the body streams and the PTX module. Inside Do, from
// Close.
func (c *CUDA) whileClose(keep func(error)) {
	for _, s := range c.while.streams {
		keep(s.Destroy())
	}
	if c.while.module != 0 {
		keep(c.while.module.Unload())
	}
	c.while = whileState{}
}

// WhilePTX reports whether While's condition kernel was loaded from PTX
// (the fallback when NVRTC's cubin did not resolve
// cudaGraphSetConditional), for diagnostics; false on the host and before
// the first While.
func (e *Engine) WhilePTX() bool { return e.cuda != nil && e.cuda.while.module != 0 }
