package unet

import (
	"encoding/json"
	"fmt"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
	"gpukit/trainer/internal/driver"
)

// task is a diffusion U-Net's run on Fashion-MNIST (driver.Task).
type task struct {
	cfg     Config
	dataDir string
	// Snapshots of the EMA published to the pool every publishEvery steps
	// (0: none) under publishPrefix.
	publishEvery  int
	publishPrefix string
	train         *data.Set // after Load (after --limit)
}

func (t *task) Config() any { return t.cfg }
func (t *task) Steps() int  { return t.cfg.Steps }

// Load reads the training split of Fashion-MNIST and checks it fits the
// model.
func (t *task) Load(dist.World) error {
	set, err := data.Load(t.dataDir, data.Train)
	if err != nil {
		return fmt.Errorf("%w (install the Debian package dataset-fashion-mnist or pass --data)", err)
	}
	if t.cfg.Limit > 0 {
		set = set.Limit(t.cfg.Limit)
	}
	S := t.cfg.UNet.Size
	if set.Rows > S || set.Cols > S || t.cfg.UNet.InChannels != 1 {
		return driver.Configf("%d×%d grey images into a %d×%d×%d model", set.Rows, set.Cols, S, S, t.cfg.UNet.InChannels)
	}
	if set.Classes() > t.cfg.UNet.Classes {
		return driver.Configf("%d classes in the data, %d in the model", set.Classes(), t.cfg.UNet.Classes)
	}
	t.train = set
	return nil
}

// Init is the U-Net's initial weights (the EMA starts as them).
func (t *task) Init(a device.Allocator) (driver.Checkpoint, error) {
	m, err := nn.NewUNet(a, "init", t.cfg.UNet, nn.UNetOptions{}, t.cfg.Seed)
	if err != nil {
		return driver.Checkpoint{}, err
	}
	defer m.Free()
	flat, err := m.Flat().ReadF32()
	if err != nil {
		return driver.Checkpoint{}, err
	}
	entries, err := diffusion.CheckpointEntries(m, append([]float32(nil), flat...), nil)
	return driver.Checkpoint{Model: entries, Meta: meta(t.cfg)}, err
}

func (t *task) Build(env *driver.Env) (driver.Trainer, error) {
	u, err := newUNetRun(env.Engine, env.Alloc, env.Run, t.cfg, env.Precision)
	if err != nil {
		return nil, err
	}
	r := &trainer{t: t, u: u, e: env.Engine}
	if pc, ok := env.Alloc.(*pool.Client); ok && t.publishEvery > 0 {
		r.pub, r.prefix = poolPublisher{c: pc}, t.publishPrefix
		if r.prefix == "" {
			r.prefix = env.Run + "/weights"
		}
	}
	return r, nil
}

func (t *task) Summary(r driver.Result, model string) string {
	if !r.Trained {
		return fmt.Sprintf("nothing to do: the checkpoint already has %d steps (raise --steps)", r.Step)
	}
	return fmt.Sprintf("%d steps in %.1fs; last loss %.4f; wrote %s (sample with: sampler sample --ckpt %s)",
		r.Step, r.Elapsed.Seconds(), r.Loss, model, model)
}

// trainer is the U-Net on a device (driver.Trainer, Saver, PostStepper,
// AfterStepper).
type trainer struct {
	t         *task
	u         *unetRun
	e         *ops.Engine
	pub       Publisher
	prefix    string // the snapshots' pool name prefix
	published []string
}

func (r *trainer) Describe() string {
	c := r.t.cfg
	return fmt.Sprintf("diffusion U-Net of %.2fM parameters (channels %v, %d×%d, %s schedule of %d steps)",
		float64(r.u.m.NumParams())/1e6, c.UNet.Channels, c.UNet.Size, c.UNet.Size, c.Schedule, c.Timesteps)
}

func (r *trainer) Inputs() []*tensor.Tensor {
	s := r.u.step
	return []*tensor.Tensor{s.X0, s.T, s.Y, r.u.lr}
}

func (r *trainer) Fill(step int, in [][]byte) error {
	c := r.t.cfg
	B, S := c.Batch, c.UNet.Size
	batch(c, r.t.train, step, tensor.BytesAs[float32](in[0])[:B*S*S], tensor.BytesAs[int32](in[2])[:B], tensor.BytesAs[int32](in[1])[:B])
	tensor.BytesAs[float32](in[3])[0] = c.LRAt(step) / c.LR
	return nil
}

func (r *trainer) Compute(gt *trace.GPUTimer) error { return r.u.compute(r.e, gt) }
func (r *trainer) Capturable() bool                 { return true }

// PostStep updates the EMA, eagerly: its decay changes with the step
// during the warm-up (a replayed graph would keep the first one's).
func (r *trainer) PostStep() func(int, *trace.GPUTimer) error {
	return func(step int, gt *trace.GPUTimer) error { return r.u.ema(r.e, step, gt) }
}

// Metrics: the loss of the step's batch (the mean squared error of the
// predicted noise), images/s, the gradient norm before clipping.
func (r *trainer) Metrics() driver.Metrics {
	return driver.Metrics{Loss: r.u.step.Loss, GradNorm: r.u.norm, Unit: "images", Items: float64(r.t.cfg.Batch),
		LogFinal: true, LossName: "noise-prediction MSE"}
}

func (r *trainer) LR(step int) float32 { return r.t.cfg.LRAt(step) }

func (r *trainer) Checkpoint(int) (driver.Checkpoint, error) { return r.u.checkpoint() }
func (r *trainer) Load(f *ckpt.File) error                   { return r.u.load(f) }
func (r *trainer) Free()                                     { r.u.free() }
func (r *trainer) SaveEvery() int                            { return r.t.cfg.SaveEvery }

// AfterStep publishes a snapshot of the EMA to the pool every
// --publish-every steps.
func (r *trainer) AfterStep(done int) error {
	if r.pub == nil || done%r.t.publishEvery != 0 {
		return nil
	}
	return r.u.publish(r.e, r.pub, r.prefix, done, &r.published)
}

// storedConfig is a resumed run's configuration.
func storedConfig(raw json.RawMessage) (Config, error) {
	var cfg Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return cfg, fmt.Errorf("%w: config: %v", driver.ErrCheckpoint, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
	}
	return cfg, nil
}
