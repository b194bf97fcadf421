package driver

import "gpukit/libgpu/trace"

// Names on the timeline (libgpu/trace; tracing is on when the CLI was given
// --trace or GPUKIT_TRACE). Host spans go on the process's main track in
// category TraceCat: "step" (argument step, 1-based) with children "data"
// (waiting for a staging slot and filling it), "forward", "backward",
// "all-reduce" (data-parallel runs: queuing the buckets' all-reduces not
// yet out and the join of their stream; the others go out during
// "backward"), "clip", "optimizer" (queuing those ops; on the host,
// running them), "graph capture", "graph replay" and "log" (reading the
// loss, which waits for the GPU, and writing the line); outside steps
// "evaluate" and "checkpoint". On a GPU a GPUTimer puts on the "GPU:
// trainer" track the GPU time of every graph replay and, in eager steps,
// of each phase a model's Compute runs through Phase or RunPhases. tracer
// report's step breakdown reads these names.
const (
	TraceCat = "trainer"

	SpanStep       = "step"
	SpanData       = "data"
	SpanForward    = "forward"
	SpanBackward   = "backward"
	SpanReduce     = "all-reduce"
	SpanClip       = "clip"
	SpanOptimizer  = "optimizer"
	SpanCapture    = "graph capture"
	SpanReplay     = "graph replay"
	SpanLog        = "log"
	SpanEvaluate   = "evaluate"
	SpanCheckpoint = "checkpoint"
	SpanEMA        = "ema"
	gpuTimerName   = "trainer"
	argStep        = "step"
)

// Phase is one part of a step on the timeline: a host span and, when the
// GPU timer is set (an eager step on a GPU, never inside a capture), a GPU
// span of the work queued between BeginPhase and End. Keep it in a local.
type Phase struct {
	h trace.Span
	g trace.GPUSpan
}

// BeginPhase starts a phase; with gt set it must run where the device's
// context is current (inside a Trainer's Compute, which the step runner
// calls in the device's Do). Nothing is recorded with tracing off.
func BeginPhase(gt *trace.GPUTimer, name string) Phase {
	return Phase{h: trace.Default().Begin(TraceCat, name), g: gt.Begin(trace.CategoryGPU, name)}
}

// End ends the phase.
func (p *Phase) End() {
	p.g.End()
	p.h.End()
}

// NamedPhase is a phase's name (one of the Span names) and its work.
type NamedPhase struct {
	Name string
	F    func() error
}

// RunPhases runs each phase's work inside its phase, in order, and stops
// at the first error: what a Trainer's Compute is, for most models.
func RunPhases(gt *trace.GPUTimer, phases []NamedPhase) error {
	for _, ph := range phases {
		p := BeginPhase(gt, ph.Name)
		err := ph.F()
		p.End()
		if err != nil {
			return err
		}
	}
	return nil
}
