package train

import "gpukit/libgpu/trace"

// Names on the timeline (libgpu/trace; tracing is on when the CLI was given
// --trace or GPUKIT_TRACE). Host spans go on the process's main track in
// category traceCat: "step" (argument step, 1-based) with children "data"
// (waiting for a staging slot and filling it), "forward", "backward",
// "all-reduce" (data-parallel runs: queuing the buckets' all-reduces not
// yet out and the join of their stream; the others go out during
// "backward"), "clip", "optimizer" (queuing those ops; on the host,
// running them),
// "graph capture", "graph replay" and "log" (reading the loss, which waits
// for the GPU, and writing the line); outside steps "evaluate" and
// "checkpoint". On a GPU a GPUTimer puts on the "GPU: trainer" track the
// GPU time of every graph replay and, in eager steps, of each of forward,
// backward, clip and optimizer. tracer report's step breakdown reads these
// names.
const (
	traceCat = "trainer"

	spanStep       = "step"
	spanData       = "data"
	spanForward    = "forward"
	spanBackward   = "backward"
	spanReduce     = "all-reduce"
	spanClip       = "clip"
	spanOptimizer  = "optimizer"
	spanCapture    = "graph capture"
	spanReplay     = "graph replay"
	spanLog        = "log"
	spanEvaluate   = "evaluate"
	spanCheckpoint = "checkpoint"
	gpuTimerName   = "trainer"
	argStep        = "step"
)

// phase is one part of a step on the timeline: a host span and, when the
// GPU timer is set (an eager step on a GPU, never inside a capture), a GPU
// span of the work queued between begin and end. Keep it in a local.
type phase struct {
	h trace.Span
	g trace.GPUSpan
}

// beginPhase starts a phase; with gt set it must run where the device's
// context is current (inside CUDADevice.Do). Nothing is recorded with
// tracing off.
func beginPhase(gt *trace.GPUTimer, name string) phase {
	return phase{h: trace.Default().Begin(traceCat, name), g: gt.Begin(trace.CategoryGPU, name)}
}

func (p *phase) end() {
	p.g.End()
	p.h.End()
}

// namedPhase is a phase's name and its work.
type namedPhase struct {
	name string
	f    func() error
}

// runPhases runs each phase's work inside its phase, in order, and stops
// at the first error.
func runPhases(gt *trace.GPUTimer, phases []namedPhase) error {
	for _, ph := range phases {
		p := beginPhase(gt, ph.name)
		err := ph.f()
		p.end()
		if err != nil {
			return err
		}
	}
	return nil
}
