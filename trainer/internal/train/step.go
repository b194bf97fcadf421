package train

import (
	"errors"
	"fmt"
	"io"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// stepper runs training steps of a model on an engine. Each step: batch()
// returns host slices for the next batch (waiting, on a GPU, until the
// staging memory is free), the caller fills them, then run() trains on them.
type stepper interface {
	batch() (x []float32, y []int32, err error)
	run() error
	close() error
}

// newStepper picks the stepper for e's device: the host one, or the CUDA
// one (pinned staging, and with graph a CUDA graph of the whole step).
func newStepper(e *ops.Engine, m *model, graph bool) (stepper, error) {
	cd, ok := e.Device().(device.CUDADevice)
	if !ok || e.Device().Kind() != device.KindCUDA {
		b, d := m.mlp.Config().Batch, m.cfg.Widths[0]
		return &hostStepper{e: e, m: m, x: make([]float32, b*d), y: make([]int32, b)}, nil
	}
	st, ok := e.Impl().(ops.Streamer)
	if !ok {
		return nil, fmt.Errorf("%w: the CUDA backend exposes no stream", ops.ErrNoBackend)
	}
	return newCUDAStepper(e, cd, st.Stream(), m, graph)
}

// hostStepper writes the batch with tensor writes and runs the ops eagerly.
type hostStepper struct {
	e *ops.Engine
	m *model
	x []float32
	y []int32
}

func (h *hostStepper) batch() ([]float32, []int32, error) { return h.x, h.y, nil }

func (h *hostStepper) run() error {
	if err := h.m.mlp.Input().WriteF32(h.x); err != nil {
		return err
	}
	if err := h.m.mlp.Labels().Write(tensor.AsBytes(h.y)); err != nil {
		return err
	}
	return h.m.compute(h.e, nil)
}

func (h *hostStepper) close() error { return nil }

// slots is the number of pinned staging buffers (and graphs) the CUDA
// stepper cycles through: the host fills one while the GPU runs the step
// that reads another.
const slots = 2

// cudaStepper moves each batch through pinned host memory: the host fills
// slot s, then the step queues cuMemcpyHtoDAsync from slot s into the
// model's static input and label buffers, forward, backward, clipping and
// the optimizer, all on the engine's stream, and records slot s's event.
// Before slot s is filled again the host waits for that event (the step
// two steps back), so filling overlaps the GPU's work and nothing inside a
// step waits for the host.
//
// With graph, the first step runs eagerly (it sizes the backend's scratch
// buffers and picks GEMM algorithms); then the step is captured once per
// slot (the copy's source address differs) and every later step is one
// cuGraphLaunch. The AdamW step counter lives on the device, so replays
// advance it; the learning rate is baked into the graphs.
type cudaStepper struct {
	e      *ops.Engine
	dev    device.CUDADevice
	stream cuda.Stream
	m      *model
	graph  bool

	n      int // steps run
	xBytes int64
	yBytes int64
	host   [slots]unsafe.Pointer // pinned: x then y
	done   [slots]cuda.Event
	used   [slots]bool
	graphs [slots]cuda.Graph
	execs  [slots]cuda.GraphExec
	gt     *trace.GPUTimer // GPU spans on the stream (nil: tracing off)
}

func newCUDAStepper(e *ops.Engine, cd device.CUDADevice, s cuda.Stream, m *model, graph bool) (*cudaStepper, error) {
	c := &cudaStepper{e: e, dev: cd, stream: s, m: m, graph: graph,
		xBytes: m.mlp.Input().Bytes(), yBytes: m.mlp.Labels().Bytes()}
	err := cd.Do(func() error {
		for i := range slots {
			p, err := cuda.MemHostAlloc(c.xBytes + c.yBytes)
			if err != nil {
				return fmt.Errorf("pinned staging of %d bytes: %w", c.xBytes+c.yBytes, err)
			}
			c.host[i] = p
			if c.done[i], err = cuda.EventCreate(cuda.EventDisableTiming); err != nil {
				return err
			}
		}
		var err error
		c.gt, err = trace.NewGPUTimer(trace.Default(), cd.Context(), s, gpuTimerName)
		return err
	})
	if err != nil {
		c.close()
		return nil, fmt.Errorf("train: %w", err)
	}
	return c, nil
}

func (c *cudaStepper) slot() int { return c.n % slots }

func (c *cudaStepper) batch() ([]float32, []int32, error) {
	s := c.slot()
	if c.used[s] {
		if err := c.dev.Do(c.done[s].Synchronize); err != nil {
			return nil, nil, fmt.Errorf("train: waiting for step %d: %w", c.n-slots+1, err)
		}
	}
	x := unsafe.Slice((*float32)(c.host[s]), c.xBytes/4)
	y := unsafe.Slice((*int32)(unsafe.Add(c.host[s], c.xBytes)), c.yBytes/4)
	return x, y, nil
}

// queue queues the copies of slot s and the whole step on the stream, on
// one pinned thread with the context current. gt, when set, times each
// phase on the GPU: pass nil while capturing.
func (c *cudaStepper) queue(s int, gt *trace.GPUTimer) error {
	return c.dev.Do(func() error {
		err := cuda.MemcpyHtoDAsync(cuda.DevicePtr(c.m.mlp.Input().Ptr()), c.host[s], c.xBytes, c.stream)
		if err == nil {
			err = cuda.MemcpyHtoDAsync(cuda.DevicePtr(c.m.mlp.Labels().Ptr()), unsafe.Add(c.host[s], c.xBytes), c.yBytes, c.stream)
		}
		if err != nil {
			return fmt.Errorf("train: batch copy: %w", err)
		}
		return c.m.compute(c.e, gt)
	})
}

// capture records the step of slot s into a graph and instantiates it, on
// one pinned thread (thread-local capture mode).
func (c *cudaStepper) capture(s int) error {
	return c.dev.Do(func() error {
		if err := c.stream.BeginCapture(cuda.CaptureModeThreadLocal); err != nil {
			return err
		}
		qerr := c.queue(s, nil) // no events may be recorded into the graph
		g, err := c.stream.EndCapture()
		if qerr != nil {
			if err == nil {
				g.Destroy()
			}
			return qerr
		}
		if err != nil {
			return err
		}
		x, err := g.Instantiate()
		if err != nil {
			g.Destroy()
			return err
		}
		c.graphs[s], c.execs[s] = g, x
		return nil
	})
}

func (c *cudaStepper) run() error {
	s := c.slot()
	switch {
	case !c.graph || c.n == 0:
		if err := c.queue(s, c.gt); err != nil {
			return err
		}
	default:
		if c.execs[s] == 0 {
			p := beginPhase(nil, spanCapture)
			err := c.capture(s)
			p.end()
			if err != nil {
				return fmt.Errorf("train: capturing the step as a CUDA graph: %w", err)
			}
		}
		err := c.dev.Do(func() error {
			p := beginPhase(c.gt, spanReplay)
			err := c.execs[s].Launch(c.stream)
			p.end()
			return err
		})
		if err != nil {
			return fmt.Errorf("train: graph launch: %w", err)
		}
	}
	if err := c.dev.Do(func() error { return c.done[s].Record(c.stream) }); err != nil {
		return err
	}
	c.used[s] = true
	c.n++
	return nil
}

// close waits for the stream and frees graphs, events and staging memory.
func (c *cudaStepper) close() error {
	return c.dev.Do(func() error {
		var errs []error
		errs = append(errs, c.stream.Synchronize())
		if err := c.gt.Close(); err != nil {
			errs = append(errs, fmt.Errorf("trace: %w", err))
		}
		c.gt = nil
		for i := range slots {
			if c.execs[i] != 0 {
				errs = append(errs, c.execs[i].Destroy())
			}
			if c.graphs[i] != 0 {
				errs = append(errs, c.graphs[i].Destroy())
			}
			if c.done[i] != 0 {
				errs = append(errs, c.done[i].Destroy())
			}
			if c.host[i] != nil {
				errs = append(errs, cuda.MemFreeHost(c.host[i]))
			}
		}
		c.execs, c.graphs, c.done, c.host = [slots]cuda.GraphExec{}, [slots]cuda.Graph{}, [slots]cuda.Event{}, [slots]unsafe.Pointer{}
		return errors.Join(errs...)
	})
}

// closeEngine releases the engine's backend resources (the CUDA backend's
// stream, workspace and scratch) when it has any.
func closeEngine(e *ops.Engine) error {
	if c, ok := e.Impl().(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// pixelTable maps a raw pixel to its normalised value exactly as
// data.Set.Normalize computes it ((p/255 − Mean)/Std in float32).
var pixelTable = func() (t [256]float32) {
	for p := range t {
		t[p] = (float32(p)/255 - data.Mean) / data.Std
	}
	return t
}()

// fill writes batch idx of set into x (normalised pixels, through
// pixelTable) and y (labels): data.Set.Fill's output, without a division
// per pixel.
func fill(set *data.Set, x []float32, y []int32, idx []int) error {
	d := set.Dim()
	if len(x) < len(idx)*d || len(y) < len(idx) {
		return fmt.Errorf("%w: %d examples into x of %d and y of %d elements", data.ErrBatch, len(idx), len(x), len(y))
	}
	for k, i := range idx {
		if i < 0 || i >= set.N {
			return fmt.Errorf("%w: example %d of %d", data.ErrBatch, i, set.N)
		}
		row := x[k*d : (k+1)*d]
		for j, p := range set.Images[i*d : (i+1)*d] {
			row[j] = pixelTable[p]
		}
		y[k] = int32(set.Labels[i])
	}
	return nil
}
