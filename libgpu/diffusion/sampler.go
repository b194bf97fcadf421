package diffusion

import (
	"errors"
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// SamplerOptions configure a Sampler.
type SamplerOptions struct {
	N        int  // images per run
	Guidance bool // classifier-free guidance: conditional and unconditional passes as one batch of 2N
	// Residual also records the model at batch N (sharing the weights)
	// for video runs of plans with PlanOptions.Residual (R-CFG: one pass
	// a step), so a guided sampler runs its first frame with two passes
	// and the later frames with one. Without Guidance the model is
	// already at batch N and Residual adds nothing.
	Residual bool
	Autocast tensor.DType // the U-Net's activation dtype (tensor.BF16 on a GPU)
	Graph    bool         // capture each loop as one CUDA graph (GPU only)
	Seed     uint64       // the noise's Philox key
	Prefix   string       // buffer names <Prefix>/acts/...
	// Weights are the weights to sample with (m.WeightsEMA(), say); nil:
	// m's parameters, with the GEMM and convolution operands copied once to
	// Autocast's dtype (nn.UNet.CastParams), so the loop casts nothing.
	Weights  []nn.Param
	MaxSteps int // the largest plan (rows of the device table); 0: 1000
}

// Sampler runs sampling loops of a U-Net on one engine. A run is the start
// (ops.DiffusionStart: noise, or a previous frame re-noised) and one model
// evaluation plus one fused ops.DiffusionStep per step, everything queued
// on the engine's stream with no host synchronisation; the coefficients
// live in a device table, the class labels and the noise counter in device
// memory written (from pinned staging, in stream order) before each run.
// With Graph on a GPU the whole loop of a given length is captured once as
// one CUDA graph and each later run is one launch.
//
// Noise: the start draws from stream 0 and step i from stream i of
// (Seed, counter = the run's index), so a run's images depend only on the
// seed, the run index, the batch size, the labels and the plan.
type Sampler struct {
	e       *ops.Engine
	m       *nn.UNet
	o       SamplerOptions
	passes  int
	eval    *nn.UNetEval   // batch passes·N
	evalR   *nn.UNetEval   // batch N, for R-CFG video runs of a guided sampler (SamplerOptions.Residual)
	x, d    *tensor.Tensor // f32 [N, S, S, C]: the sample, the previous x̂0
	prev    *tensor.Tensor // f32: the previous frame (video)
	coef    *tensor.Tensor // f32 [MaxSteps+1, CoefWidth]
	counter *tensor.Tensor // i32 [1]
	stage   *exec.Staging
	done    *exec.Event
	t0, t1  *exec.Event
	graphs  map[loopKey]*exec.CapturedGraph
	owned   []*tensor.Tensor
	onStep  func() // the running run's RunOptions.OnStep (host only)
}

type loopKey struct {
	steps           int
	video, residual bool
}

// NewSampler allocates a sampler for m (whose weights o.Weights are used
// as they are: a pool snapshot, a checkpoint, or a training run's EMA).
func NewSampler(e *ops.Engine, a device.Allocator, m *nn.UNet, o SamplerOptions) (s *Sampler, err error) {
	if o.N < 1 {
		return nil, fmt.Errorf("%w: %d images per run", ErrConfig, o.N)
	}
	if o.MaxSteps == 0 {
		o.MaxSteps = 1000
	}
	s = &Sampler{e: e, m: m, o: o, passes: 1, graphs: map[loopKey]*exec.CapturedGraph{}}
	if o.Guidance {
		s.passes = 2
	}
	defer func() {
		if err != nil {
			s.Free()
			s = nil
		}
	}()
	c := m.Config()
	alloc := func(name string, dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
		t, err := tensor.Alloc(a, name, dt, shape...)
		if err != nil {
			return nil, fmt.Errorf("diffusion: allocating %s: %w", name, err)
		}
		s.owned = append(s.owned, t)
		return t, nil
	}
	img := []int{o.N, c.Size, c.Size, c.InChannels}
	if s.x, err = alloc(o.Prefix+"/sample/x", tensor.F32, img...); err != nil {
		return s, err
	}
	if s.d, err = alloc(o.Prefix+"/sample/x0_prev", tensor.F32, img...); err != nil {
		return s, err
	}
	if s.prev, err = alloc(o.Prefix+"/sample/frame_prev", tensor.F32, img...); err != nil {
		return s, err
	}
	if s.coef, err = alloc(o.Prefix+"/sample/coef", tensor.F32, o.MaxSteps+1, ops.CoefWidth); err != nil {
		return s, err
	}
	if s.counter, err = alloc(o.Prefix+"/sample/counter", tensor.I32, 1); err != nil {
		return s, err
	}
	for _, t := range []*tensor.Tensor{s.d, s.prev} {
		if err := e.Fill(t, 0); err != nil {
			return s, err
		}
	}
	w := o.Weights
	if w == nil {
		w = m.Params()
		if o.Autocast == tensor.BF16 {
			var cast *tensor.Tensor
			if w, cast, err = m.CastParams(e, a, o.Autocast); err != nil {
				return s, err
			}
			s.owned = append(s.owned, cast)
		}
	}
	if s.eval, err = m.RecordEval(e, a, o.Prefix, s.passes*o.N, ops.GraphOptions{Autocast: o.Autocast}, w); err != nil {
		return s, err
	}
	if o.Residual && s.passes == 2 {
		if s.evalR, err = m.RecordEval(e, a, o.Prefix+"/rcfg", o.N, ops.GraphOptions{Autocast: o.Autocast}, w); err != nil {
			return s, err
		}
	}
	if s.stage, err = e.NewStaging(s.stageSize()); err != nil {
		return s, err
	}
	if s.done, err = e.NewEvent(false); err != nil {
		return s, err
	}
	if s.t0, err = e.NewEvent(true); err != nil {
		return s, err
	}
	s.t1, err = e.NewEvent(true)
	return s, err
}

// Layout of the staging memory: the counter (16 bytes), the labels, the
// coefficient table.
func (s *Sampler) labelsOff() int64 { return 16 }
func (s *Sampler) coefOff() int64 {
	return (s.labelsOff() + int64(4*s.passes*s.o.N) + 15) / 16 * 16
}
func (s *Sampler) stageSize() int64 { return s.coefOff() + s.coef.Bytes() }

// Free releases the sampler's buffers, graphs and events.
func (s *Sampler) Free() error {
	errs := []error{s.e.Sync()}
	for _, g := range s.graphs {
		errs = append(errs, g.Close())
	}
	s.graphs = nil
	for _, v := range []*nn.UNetEval{s.eval, s.evalR} {
		if v != nil {
			errs = append(errs, v.Free())
		}
	}
	for _, v := range []*exec.Event{s.done, s.t0, s.t1} {
		if v != nil {
			errs = append(errs, v.Close())
		}
	}
	if s.stage != nil {
		errs = append(errs, s.stage.Close())
	}
	for _, t := range s.owned {
		errs = append(errs, t.Buf.Free())
	}
	s.owned = nil
	return errors.Join(errs...)
}

// Images is the device buffer holding the last run's samples (f32 [N, S,
// S, C], in [−1, 1] when clipping).
func (s *Sampler) Images() *tensor.Tensor { return s.x }

// Eval is the model graph the loop evaluates (batch passes·N; R-CFG video
// runs of a guided sampler evaluate another, at batch N).
func (s *Sampler) Eval() *nn.UNetEval { return s.eval }

// RunOptions are one run's inputs.
type RunOptions struct {
	Labels []int32 // N class labels (nn's null class Classes: unconditional)
	Run    int     // the noise counter: a new run index draws new noise
	// Video starts from the previous run's images (the last frame),
	// re-noised to the plan's Strength and blended by its Blend, and keeps
	// this run's images as the next previous frame.
	Video bool
	// OnStep, when set, is called after each step on an engine that runs
	// work as it is queued (the host), so a progress bar can move within
	// a run; on a GPU the steps are queued (or replayed) at once and it is
	// not called.
	OnStep func()
}

// Run queues one sampling run of plan p and waits for it; the images are
// then in Images. A sampler without Guidance evaluates only the labels
// given (the null class samples unconditionally) and ignores the plan's
// guidance scale. A plan with PlanOptions.Residual runs only as a video run
// (R-CFG needs the previous frame), on one pass of N images (the batch-N
// model of SamplerOptions.Residual, or the one model of an unguided
// sampler). It returns the run's GPU time in milliseconds (0 on the
// host). The first run of a loop length runs eagerly (warming kernels,
// scratch buffers and GEMM choices); with Graph, later runs of that length
// replay one captured graph.
func (s *Sampler) Run(p *Plan, r RunOptions) (float32, error) {
	steps := len(p.Rows) - 1
	if steps < 1 || steps > s.o.MaxSteps {
		return 0, fmt.Errorf("%w: a plan of %d steps (at most %d)", ErrConfig, steps, s.o.MaxSteps)
	}
	if len(r.Labels) != s.o.N {
		return 0, fmt.Errorf("%w: %d labels for %d images", ErrConfig, len(r.Labels), s.o.N)
	}
	null := int32(s.m.Config().Classes)
	for _, l := range r.Labels {
		if l < 0 || l > null {
			return 0, fmt.Errorf("%w: label %d (want 0..%d)", ErrConfig, l, null)
		}
	}
	residual := p.Options.Residual
	if residual && !r.Video {
		return 0, fmt.Errorf("%w: a residual-guidance (R-CFG) plan in a run without a previous frame (want a video run)", ErrConfig)
	}
	ev := s.eval
	if residual && s.passes == 2 {
		if s.evalR == nil {
			return 0, fmt.Errorf("%w: a residual-guidance (R-CFG) plan on a guided sampler made without SamplerOptions.Residual", ErrConfig)
		}
		ev = s.evalR
	}
	if err := s.done.Wait(); err != nil { // the staging memory is free again
		return 0, err
	}
	b := s.stage.Bytes()
	tensor.BytesAs[int32](b[:4])[0] = int32(r.Run)
	lab := tensor.BytesAs[int32](b[s.labelsOff() : s.labelsOff()+int64(4*s.passes*s.o.N)])
	copy(lab, r.Labels)
	for i := s.o.N; i < len(lab); i++ {
		lab[i] = null
	}
	tab := tensor.BytesAs[float32](b[s.coefOff() : s.coefOff()+s.coef.Bytes()])
	clear(tab)
	copy(tab, p.Table())
	key := loopKey{steps: steps, video: r.Video, residual: ev != s.eval}
	s.onStep = nil
	if !s.e.IsGraphCapable() {
		s.onStep = r.OnStep
	}
	defer func() { s.onStep = nil }()
	err := s.e.Do(func() error {
		if err := s.e.CopyIn(s.counter, s.stage, 0); err != nil {
			return err
		}
		if err := s.e.CopyIn(ev.Y, s.stage, s.labelsOff()); err != nil { // its first N labels are the conditional ones
			return err
		}
		if err := s.e.CopyIn(s.coef, s.stage, s.coefOff()); err != nil {
			return err
		}
		if err := s.t0.Record(); err != nil {
			return err
		}
		g := s.graphs[key]
		switch {
		case g != nil:
			if err := g.Launch(); err != nil {
				return fmt.Errorf("diffusion: sampling graph: %w", err)
			}
		default:
			if err := s.loop(ev, steps, r.Video); err != nil {
				return err
			}
		}
		if err := s.t1.Record(); err != nil {
			return err
		}
		return s.done.Record()
	})
	if err != nil {
		return 0, err
	}
	if err := s.t1.Wait(); err != nil {
		return 0, err
	}
	ms, err := s.t1.Elapsed(s.t0)
	if err != nil {
		return 0, err
	}
	if s.o.Graph && s.e.IsGraphCapable() && s.graphs[key] == nil {
		g, err := s.e.Capture(func() error { return s.loop(ev, steps, r.Video) })
		if err != nil {
			return 0, fmt.Errorf("diffusion: capturing the sampling loop: %w", err)
		}
		s.graphs[key] = g
	}
	return ms, nil
}

// loop queues a run of the given length of model ev on the engine's stream.
func (s *Sampler) loop(ev *nn.UNetEval, steps int, video bool) error {
	st := ops.DiffusionStep{X: s.x, XIn: ev.X, TIn: ev.T, Coef: s.coef, Counter: s.counter, Seed: s.o.Seed}
	if video {
		st.Prev = s.prev
	}
	if err := s.e.DiffusionStart(st); err != nil {
		return err
	}
	for i := 1; i <= steps; i++ {
		if err := ev.Graph.Forward(); err != nil {
			return err
		}
		step := st
		step.D, step.Eps, step.Row, step.Stream = s.d, ev.Eps.Value, i, uint32(i)
		if i == steps {
			step.XIn, step.TIn = nil, nil // nothing evaluates the last sample
		}
		if err := s.e.DiffusionStep(step); err != nil {
			return err
		}
		if s.onStep != nil {
			s.onStep()
		}
	}
	if video {
		return s.e.Copy(s.prev, s.x)
	}
	return nil
}

// SetPrevious makes the current images the previous frame (a video's
// first frame, sampled without Video).
func (s *Sampler) SetPrevious() error {
	return s.e.Do(func() error { return s.e.Copy(s.prev, s.x) })
}
