package sample

import (
	"fmt"
	"time"

	"gpukit/libgpu/device"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// GenOptions configure Generate.
type GenOptions struct {
	Engine   *ops.Engine
	Alloc    device.Allocator
	Plan     diffusion.PlanOptions
	N        int // images in all
	Batch    int // images per run (the last run's extra images are dropped)
	Class    int // the class of every image, or −1: image i gets class i mod classes
	Seed     uint64
	Graph    bool         // one CUDA graph per sampling loop (GPU only)
	Autocast tensor.DType // the U-Net's activation dtype
	// OnBatch, when set, is called after each run.
	OnBatch func(BatchStat) error
	// OnStep, when set, is called once per sampling step of each run: as
	// each step ends on the host, after the run on a GPU (progress bars).
	OnStep func()
}

// BatchStat times one run.
type BatchStat struct {
	Batch  int     // run index (0-based), the noise counter
	Images int     // images kept from it
	GPUMS  float32 // GPU time of the run (0 on the host)
	WallMS float64 // host time from queuing to the images read back
}

// MS is the run's time in milliseconds: its GPU time where it was
// measured (on a GPU), else its wall time.
func (b BatchStat) MS() float64 {
	if b.GPUMS > 0 {
		return float64(b.GPUMS)
	}
	return b.WallMS
}

// Labels are the class labels of images [0, n) for class (−1: i mod classes).
func Labels(n, class, classes int) []int32 {
	y := make([]int32, n)
	for i := range y {
		y[i] = int32(class)
		if class < 0 {
			y[i] = int32(i % classes)
		}
	}
	return y
}

// needsTwoPasses reports whether a guidance scale needs the unconditional
// pass: s = 1 is conditional sampling.
func needsTwoPasses(scale float64) bool { return scale != 1 }

// Generate samples o.N images with model m: runs of o.Batch images (run b
// draws its noise with counter b), f32 [N, S, S, C] in [−1, 1] on return,
// with their labels.
func Generate(m *Model, o GenOptions) ([]float32, []int32, error) {
	c := m.Config.UNet
	if o.N < 1 || o.Batch < 1 {
		return nil, nil, fmt.Errorf("%w: --n %d, --batch %d (want ≥ 1)", ErrUsage, o.N, o.Batch)
	}
	if o.Class < -1 || o.Class > c.Classes {
		return nil, nil, fmt.Errorf("%w: --class %d (want 0..%d, %d for unconditional, or all)", ErrUsage, o.Class, c.Classes-1, c.Classes)
	}
	sched, err := m.Config.NoiseSchedule()
	if err != nil {
		return nil, nil, err
	}
	plan, err := diffusion.NewPlan(sched, o.Plan)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	batch := min(o.Batch, o.N)
	s, err := diffusion.NewSampler(o.Engine, o.Alloc, m.UNet, diffusion.SamplerOptions{N: batch, Guidance: needsTwoPasses(o.Plan.Guidance),
		Autocast: o.Autocast, Graph: o.Graph, Seed: o.Seed, Prefix: "sampler", MaxSteps: len(plan.Rows) - 1})
	if err != nil {
		return nil, nil, err
	}
	defer s.Free()
	per := c.Size * c.Size * c.InChannels
	labels := Labels(o.N, o.Class, c.Classes)
	out := make([]float32, o.N*per)
	for b, i0 := 0, 0; i0 < o.N; b, i0 = b+1, i0+batch {
		k := min(batch, o.N-i0)
		y := make([]int32, batch)
		copy(y, labels[i0:i0+k])
		start := time.Now()
		ms, err := runSteps(s, plan, diffusion.RunOptions{Labels: y, Run: b}, o.OnStep)
		if err != nil {
			return nil, nil, err
		}
		v, err := s.Images().ReadF32()
		if err != nil {
			return nil, nil, err
		}
		copy(out[i0*per:(i0+k)*per], v)
		if o.OnBatch != nil {
			if err := o.OnBatch(BatchStat{Batch: b, Images: k, GPUMS: ms, WallMS: float64(time.Since(start).Microseconds()) / 1000}); err != nil {
				return nil, nil, err
			}
		}
	}
	return out, labels, nil
}

// runSteps is s.Run with onStep called once per step of the plan: by the
// sampler as each step ends where it can (the host), the rest after the
// run.
func runSteps(s *diffusion.Sampler, p *diffusion.Plan, r diffusion.RunOptions, onStep func()) (float32, error) {
	if onStep == nil {
		return s.Run(p, r)
	}
	called := 0
	r.OnStep = func() { called++; onStep() }
	ms, err := s.Run(p, r)
	if err != nil {
		return ms, err
	}
	for ; called < len(p.Rows)-1; called++ {
		onStep()
	}
	return ms, nil
}

// VideoOptions configure Video.
type VideoOptions struct {
	Engine *ops.Engine
	Alloc  device.Allocator
	First  diffusion.PlanOptions // the first frame, sampled from noise
	// Next is every later frame's plan: Strength and Blend set, and with
	// Residual, R-CFG (one model pass a step) instead of an unconditional
	// pass.
	Next   diffusion.PlanOptions
	Frames int
	// Streams is how many videos are sampled together, one batch of
	// Streams images a step (0: one); they differ by their noise.
	Streams  int
	Class    int // every frame's class, or −1: morph through the classes (frame f: class ⌊f·classes/frames⌋)
	Seed     uint64
	Graph    bool
	Autocast tensor.DType
	// OnFrame is called with each frame (f32 [Streams, S, S, C]: the
	// streams' frame f, read back into a slice of its own, which OnFrame
	// may keep) as it comes.
	OnFrame func(f int, class int32, img []float32, st BatchStat) error
	// OnStep is GenOptions.OnStep for the frames' sampling steps.
	OnStep func()
}

// Video samples Streams sequences of images in which frame f > 0 starts
// from frame f−1 re-noised to Next.Strength and blends x̂0 with it by
// Next.Blend inside the fused step (the seeds' temporal blending), with
// its own class and noise (counter f).
func Video(m *Model, o VideoOptions) error {
	c := m.Config.UNet
	if o.Frames < 1 {
		return fmt.Errorf("%w: --frames %d", ErrUsage, o.Frames)
	}
	if o.Class < -1 || o.Class > c.Classes {
		return fmt.Errorf("%w: --class %d", ErrUsage, o.Class)
	}
	sched, err := m.Config.NoiseSchedule()
	if err != nil {
		return err
	}
	first, err := diffusion.NewPlan(sched, o.First)
	if err != nil {
		return fmt.Errorf("%w: first frame: %v", ErrUsage, err)
	}
	next, err := diffusion.NewPlan(sched, o.Next)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	streams := max(o.Streams, 1)
	guided := needsTwoPasses(o.First.Guidance) || (needsTwoPasses(o.Next.Guidance) && !o.Next.Residual)
	s, err := diffusion.NewSampler(o.Engine, o.Alloc, m.UNet, diffusion.SamplerOptions{N: streams, Guidance: guided,
		Residual: o.Next.Residual, Autocast: o.Autocast, Graph: o.Graph, Seed: o.Seed, Prefix: "sampler",
		MaxSteps: max(len(first.Rows), len(next.Rows)) - 1})
	if err != nil {
		return err
	}
	defer s.Free()
	for f := 0; f < o.Frames; f++ {
		class := int32(o.Class)
		if o.Class < 0 {
			class = int32(f * c.Classes / o.Frames)
		}
		labels := make([]int32, streams)
		for i := range labels {
			labels[i] = class
		}
		start := time.Now()
		var ms float32
		if f == 0 {
			ms, err = runSteps(s, first, diffusion.RunOptions{Labels: labels, Run: 0}, o.OnStep)
			if err == nil {
				err = s.SetPrevious()
			}
		} else {
			ms, err = runSteps(s, next, diffusion.RunOptions{Labels: labels, Run: f, Video: true}, o.OnStep)
		}
		if err != nil {
			return fmt.Errorf("frame %d: %w", f, err)
		}
		img, err := s.Images().ReadF32()
		if err != nil {
			return err
		}
		if o.OnFrame != nil {
			st := BatchStat{Batch: f, Images: streams, GPUMS: ms, WallMS: float64(time.Since(start).Microseconds()) / 1000}
			if err := o.OnFrame(f, class, img, st); err != nil {
				return err
			}
		}
	}
	return nil
}
