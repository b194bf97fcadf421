package driver

import (
	"errors"
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
	"gpukit/libgpu/trace/cudaev"
)

// Runner runs steps whose inputs (a batch, a learning rate) go through
// staging memory into static tensors on the engine's device: Stage returns
// a slot's staging bytes for the host to fill, Run queues the copies into
// the inputs and the step (compute) on the engine. Slots cycle, so the
// host fills one while the device runs the step that reads another;
// before a slot is refilled, Stage waits for the event recorded after its
// last step. Nothing inside a step waits for the host.
//
// With graph (CUDA only), the first step runs eagerly — it sizes scratch
// buffers, compiles kernels and picks GEMM algorithms — and then the step
// is captured once per slot (the copies' source addresses differ) and
// every later step is one graph launch. State that changes across steps
// (the optimizer's step counter, dropout's counter) lives on the device,
// and what the host changes (the learning rate) travels as an input, so
// replays need no re-capture.
//
// The driver runs every training step through one; models use one for
// other replayed work (the GPT's evaluation batches).
type Runner struct {
	e       *ops.Engine
	inputs  []*tensor.Tensor
	offs    []int64
	compute func(gt *trace.GPUTimer) error
	graph   bool
	// post, when set, runs eagerly after every step's compute (queued or
	// replayed): work that cannot be captured into a graph (an optimizer
	// whose step reads the host, optim.CanCapture false).
	post func(gt *trace.GPUTimer) error
	// phase and replayed, when set (SetPostPhases), let post be captured:
	// a graph per phase, replayed in place of post at later steps of
	// that phase.
	phase      func() int
	replayed   func()
	postGraphs phaseGraphs[int]
	// cphase, when set (SetComputePhases), makes compute's graphs per
	// phase: one per slot and phase.
	cphase  func() int
	cgraphs phaseGraphs[[2]int]

	n     int // steps run
	slots [slots]runSlot
	gt    *trace.GPUTimer // GPU spans on the stream (nil: tracing off or host)
}

type runSlot struct {
	staging *exec.Staging
	done    *exec.Event
	g       *exec.CapturedGraph
	used    bool
}

// slots is the number of staging buffers (and graphs) the runner cycles through.
const slots = 2

// NewRunner makes a runner for inputs (contiguous device tensors, copied
// in this order from each slot's staging memory) and compute, which
// queues one step on e (gt: time its phases on the GPU when non-nil).
// graph asks for CUDA graph replay; the host ignores it.
func NewRunner(e *ops.Engine, inputs []*tensor.Tensor, compute func(gt *trace.GPUTimer) error, graph bool) (*Runner, error) {
	r := &Runner{e: e, inputs: inputs, compute: compute, graph: graph && e.IsGraphCapable()}
	var size int64
	for _, t := range inputs {
		r.offs = append(r.offs, size)
		size += (t.Bytes() + 15) / 16 * 16
	}
	for i := range r.slots {
		var err error
		if r.slots[i].staging, err = e.NewStaging(max(size, 16)); err != nil {
			r.Close()
			return nil, fmt.Errorf("trainer: %w", err)
		}
		if r.slots[i].done, err = e.NewEvent(false); err != nil {
			r.Close()
			return nil, fmt.Errorf("trainer: %w", err)
		}
	}
	if cd, ok := e.Device().(device.CUDADevice); ok {
		if s := e.Stream(); s != 0 {
			var err error
			if r.gt, err = trace.NewGPUTimer(trace.Default(), cudaev.New(cd.Context(), s), gpuTimerName); err != nil {
				r.Close()
				return nil, fmt.Errorf("trainer: %w", err)
			}
		}
	}
	return r, nil
}

// SetPost makes post run eagerly after every step (see Runner).
func (r *Runner) SetPost(post func(gt *trace.GPUTimer) error) { r.post = post }

// SetPostPhases lets post be captured into CUDA graphs, one per phase
// (optim.Phaser): before each step phase says how post runs, −1 eagerly,
// else as phase p — eagerly at p's first step (sizing scratch, choosing
// GEMM algorithms), captured at its second (the capture runs post's host
// side, the graph its device work) and replayed at later ones, each replay
// followed by replayed (the host's mirror of the step). Only with graph
// replay on; the host ignores it.
func (r *Runner) SetPostPhases(phase func() int, replayed func()) {
	r.phase, r.replayed = phase, replayed
}

// SetComputePhases makes the step's compute captured per phase: before
// each step phase says how it runs, −1 eagerly (the host decides
// something inside it), else as phase p — eagerly at p's first step,
// then from a graph per slot and phase (K-FAC's factor hooks, which run
// in the backward only at some steps: optim.KFAC.ComputePhase). Only with
// graph replay on.
func (r *Runner) SetComputePhases(phase func() int) { r.cphase = phase }

// runPost runs post: eagerly, or from its phase's graph.
func (r *Runner) runPost() error {
	ph := -1
	if r.graph && r.phase != nil {
		ph = r.phase()
	}
	replayed, err := r.postGraphs.run(r, ph, ph, func(gt *trace.GPUTimer) error { return r.post(gt) }, SpanOptimizer, "the optimizer step")
	if err == nil && replayed {
		r.replayed()
	}
	return err
}

// phaseGraphs are graphs captured per phase (and key: the phase, or the
// slot and phase): a phase's first step runs eagerly (sizing scratch,
// choosing GEMM algorithms), a key's first step after that is captured
// and launched (the capture runs the host's side, the graph the device's
// work), later ones replay its graph.
type phaseGraphs[K comparable] struct {
	seen   map[int]bool
	graphs map[K]*exec.CapturedGraph
}

// run runs a step of phase ph (−1: always eagerly) under key k; work
// queues it (gt: GPU spans, nil inside a capture). replayed says whether
// it ran from a graph captured at an earlier step.
func (pg *phaseGraphs[K]) run(r *Runner, ph int, k K, work func(gt *trace.GPUTimer) error, span, what string) (replayed bool, err error) {
	if ph < 0 || !pg.seen[ph] {
		if ph >= 0 {
			if pg.seen == nil {
				pg.seen = map[int]bool{}
			}
			pg.seen[ph] = true
		}
		return false, r.e.Do(func() error { return work(r.gt) })
	}
	g := pg.graphs[k]
	replayed = g != nil
	if g == nil {
		p := BeginPhase(nil, SpanCapture)
		g, err = r.e.Capture(func() error { return work(nil) })
		p.End()
		if err != nil {
			return false, fmt.Errorf("trainer: capturing %s (phase %d) as a CUDA graph: %w", what, ph, err)
		}
		if pg.graphs == nil {
			pg.graphs = map[K]*exec.CapturedGraph{}
		}
		pg.graphs[k] = g
	}
	p := BeginPhase(r.gt, span)
	err = g.Launch()
	p.End()
	if err != nil {
		return false, fmt.Errorf("trainer: graph launch (%s): %w", what, err)
	}
	return replayed, nil
}

// close frees the graphs.
func (pg *phaseGraphs[K]) close() []error {
	var errs []error
	for _, g := range pg.graphs {
		errs = append(errs, g.Close())
	}
	pg.graphs = nil
	return errs
}

// Engine is the runner's engine.
func (r *Runner) Engine() *ops.Engine { return r.e }

func (r *Runner) slot() int { return r.n % slots }

// Stage waits until the current slot's staging memory is free and returns
// it; input i occupies [offs[i], offs[i]+Bytes) (see View).
func (r *Runner) Stage() ([]byte, error) {
	s := &r.slots[r.slot()]
	if s.used {
		if err := s.done.Wait(); err != nil {
			return nil, fmt.Errorf("trainer: waiting for step %d: %w", r.n-slots+1, err)
		}
	}
	return s.staging.Bytes(), nil
}

// View is input i's part of a slot's staging bytes.
func (r *Runner) View(b []byte, i int) []byte {
	return b[r.offs[i] : r.offs[i]+r.inputs[i].Bytes()]
}

// Views is every input's part of a slot's staging bytes, in order.
func (r *Runner) Views(b []byte) [][]byte {
	v := make([][]byte, len(r.inputs))
	for i := range v {
		v[i] = r.View(b, i)
	}
	return v
}

// queue queues the slot's copies and the step on one device thread.
func (r *Runner) queue(s int, gt *trace.GPUTimer) error {
	return r.e.Do(func() error {
		for i, t := range r.inputs {
			if err := r.e.CopyIn(t, r.slots[s].staging, r.offs[i]); err != nil {
				return fmt.Errorf("trainer: input copy: %w", err)
			}
		}
		return r.compute(gt)
	})
}

// Run queues the step on the slot staged last (see Stage).
func (r *Runner) Run() error {
	si := r.slot()
	s := &r.slots[si]
	switch {
	case r.cphase != nil && r.graph:
		// Eagerly when the phase is −1 or new, else from the slot's graph
		// of the phase.
		ph := r.cphase()
		if _, err := r.cgraphs.run(r, ph, [2]int{si, ph}, func(gt *trace.GPUTimer) error { return r.queue(si, gt) }, SpanReplay, "the step"); err != nil {
			return err
		}
	case !r.graph || r.n == 0:
		if err := r.queue(si, r.gt); err != nil {
			return err
		}
	default:
		if s.g == nil {
			p := BeginPhase(nil, SpanCapture)
			g, err := r.e.Capture(func() error { return r.queue(si, nil) }) // no events inside a graph
			p.End()
			if err != nil {
				return fmt.Errorf("trainer: capturing the step as a CUDA graph: %w", err)
			}
			s.g = g
		}
		p := BeginPhase(r.gt, SpanReplay)
		err := s.g.Launch()
		p.End()
		if err != nil {
			return fmt.Errorf("trainer: graph launch: %w", err)
		}
	}
	if r.post != nil {
		if err := r.runPost(); err != nil {
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

// Close waits for the device and frees graphs, events and staging memory.
func (r *Runner) Close() error {
	errs := []error{r.e.Sync()}
	if r.gt != nil {
		if err := r.gt.Close(); err != nil {
			errs = append(errs, fmt.Errorf("trace: %w", err))
		}
		r.gt = nil
	}
	errs = append(errs, r.postGraphs.close()...)
	errs = append(errs, r.cgraphs.close()...)
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

// CloseEngine releases the engine's backend resources (the CUDA backend's
// stream, workspace and scratch) when it has any.
func CloseEngine(e *ops.Engine) error {
	return e.Close()
}
