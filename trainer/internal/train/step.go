package train

import (
	"errors"
	"fmt"
	"io"

	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// stepRunner runs training steps whose inputs (a batch, a learning rate)
// go through staging memory into static tensors on the engine's device:
// stage returns a slot's staging bytes for the host to fill, run queues
// the copies into the inputs and the step (compute) on the engine. Slots
// cycle, so the host fills one while the device runs the step that reads
// another; before a slot is refilled, stage waits for the event recorded
// after its last step. Nothing inside a step waits for the host.
//
// With graph (CUDA only), the first step runs eagerly — it sizes scratch
// buffers, compiles kernels and picks GEMM algorithms — and then the step
// is captured once per slot (the copies' source addresses differ) and
// every later step is one graph launch. State that changes across steps
// (the optimizer's step counter, dropout's counter) lives on the device,
// and what the host changes (the learning rate) travels as an input, so
// replays need no re-capture.
type stepRunner struct {
	e       *ops.Engine
	inputs  []*tensor.Tensor
	offs    []int64
	compute func(gt *trace.GPUTimer) error
	graph   bool
	// post, when set, runs eagerly after every step's compute (queued or
	// replayed): an optimizer whose step cannot be captured into a graph
	// (optim.CanCapture false) steps here.
	post func(gt *trace.GPUTimer) error

	n     int // steps run
	slots [slots]runSlot
	gt    *trace.GPUTimer // GPU spans on the stream (nil: tracing off or host)
}

type runSlot struct {
	staging *ops.Staging
	done    *ops.Event
	g       *ops.CapturedGraph
	used    bool
}

// slots is the number of staging buffers (and graphs) the runner cycles through.
const slots = 2

// newStepRunner makes a runner for inputs (contiguous device tensors,
// copied in this order from each slot's staging memory) and compute, which
// queues one step on e (gt: time its phases on the GPU when non-nil).
// graph asks for CUDA graph replay; the host ignores it.
func newStepRunner(e *ops.Engine, inputs []*tensor.Tensor, compute func(gt *trace.GPUTimer) error, graph bool) (*stepRunner, error) {
	r := &stepRunner{e: e, inputs: inputs, compute: compute, graph: graph && e.IsGraphCapable()}
	var size int64
	for _, t := range inputs {
		r.offs = append(r.offs, size)
		size += (t.Bytes() + 15) / 16 * 16
	}
	for i := range r.slots {
		var err error
		if r.slots[i].staging, err = e.NewStaging(max(size, 16)); err != nil {
			r.close()
			return nil, fmt.Errorf("train: %w", err)
		}
		if r.slots[i].done, err = e.NewEvent(false); err != nil {
			r.close()
			return nil, fmt.Errorf("train: %w", err)
		}
	}
	if cd, ok := e.Device().(device.CUDADevice); ok {
		if st, ok := e.Impl().(ops.Streamer); ok {
			var err error
			if r.gt, err = trace.NewGPUTimer(trace.Default(), cd.Context(), st.Stream(), gpuTimerName); err != nil {
				r.close()
				return nil, fmt.Errorf("train: %w", err)
			}
		}
	}
	return r, nil
}

func (r *stepRunner) slot() int { return r.n % slots }

// stage waits until the current slot's staging memory is free and returns
// it; input i occupies [offs[i], offs[i]+Bytes) (see view).
func (r *stepRunner) stage() ([]byte, error) {
	s := &r.slots[r.slot()]
	if s.used {
		if err := s.done.Wait(); err != nil {
			return nil, fmt.Errorf("train: waiting for step %d: %w", r.n-slots+1, err)
		}
	}
	return s.staging.Bytes(), nil
}

// view is input i's part of a slot's staging bytes.
func (r *stepRunner) view(b []byte, i int) []byte {
	return b[r.offs[i] : r.offs[i]+r.inputs[i].Bytes()]
}

// queue queues the slot's copies and the step on one device thread.
func (r *stepRunner) queue(s int, gt *trace.GPUTimer) error {
	return r.e.Do(func() error {
		for i, t := range r.inputs {
			if err := r.e.CopyIn(t, r.slots[s].staging, r.offs[i]); err != nil {
				return fmt.Errorf("train: input copy: %w", err)
			}
		}
		return r.compute(gt)
	})
}

// run queues the step on the slot staged last (see stage).
func (r *stepRunner) run() error {
	si := r.slot()
	s := &r.slots[si]
	switch {
	case !r.graph || r.n == 0:
		if err := r.queue(si, r.gt); err != nil {
			return err
		}
	default:
		if s.g == nil {
			p := beginPhase(nil, spanCapture)
			g, err := r.e.Capture(func() error { return r.queue(si, nil) }) // no events inside a graph
			p.end()
			if err != nil {
				return fmt.Errorf("train: capturing the step as a CUDA graph: %w", err)
			}
			s.g = g
		}
		p := beginPhase(r.gt, spanReplay)
		err := s.g.Launch()
		p.end()
		if err != nil {
			return fmt.Errorf("train: graph launch: %w", err)
		}
	}
	if r.post != nil {
		if err := r.e.Do(func() error { return r.post(r.gt) }); err != nil {
			return err
		}
	}
	if err := s.done.Record(); err != nil {
		return err
	}
	s.used = true
	r.n++
	return nil
}

// close waits for the device and frees graphs, events and staging memory.
func (r *stepRunner) close() error {
	errs := []error{r.e.Sync()}
	if r.gt != nil {
		if err := r.gt.Close(); err != nil {
			errs = append(errs, fmt.Errorf("trace: %w", err))
		}
		r.gt = nil
	}
	for i := range r.slots {
		s := &r.slots[i]
		if s.g != nil {
			errs = append(errs, s.g.Close())
		}
		if s.done != nil {
			errs = append(errs, s.done.Close())
		}
		if s.staging != nil {
			errs = append(errs, s.staging.Close())
		}
		*s = runSlot{}
	}
	return errors.Join(errs...)
}

// mlpStepper runs the MLP's steps: the batch's normalised pixels and labels
// are its inputs.
type mlpStepper struct {
	*stepRunner
	m *model
}

// newStepper makes the MLP's step runner on e (graph: CUDA graph replay).
func newStepper(e *ops.Engine, m *model, graph bool) (*mlpStepper, error) {
	r, err := newStepRunner(e, []*tensor.Tensor{m.mlp.Input(), m.mlp.Labels()},
		func(gt *trace.GPUTimer) error { return m.compute(e, gt) }, graph && !m.hook)
	if err != nil {
		return nil, err
	}
	if m.opt != nil && m.opt.eager {
		r.post = func(gt *trace.GPUTimer) error { return eagerStep(e, m.opt, gt) }
	}
	return &mlpStepper{stepRunner: r, m: m}, nil
}

// batch waits for a free slot and returns its input and label memory.
func (s *mlpStepper) batch() ([]float32, []int32, error) {
	b, err := s.stage()
	if err != nil {
		return nil, nil, err
	}
	return tensor.BytesAs[float32](s.view(b, 0)), tensor.BytesAs[int32](s.view(b, 1)), nil
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

// eagerStep steps an optimizer that runs outside the captured step.
func eagerStep(e *ops.Engine, o *optimizerSet, gt *trace.GPUTimer) error {
	p := beginPhase(gt, spanOptimizer)
	err := o.Step(e)
	p.end()
	return err
}
