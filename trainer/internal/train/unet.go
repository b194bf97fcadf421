package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// UNetConfig defines a diffusion training run (`trainer run --model
// unet`): a class-conditional DDPM on Fashion-MNIST (28×28 padded to the
// model's size with the background value). It is stored in every
// checkpoint (metadata "config", with "model" = "unet"); its "unet",
// "schedule" and "timesteps" fields are the diffusion.ModelConfig a
// sampler rebuilds the model from.
type UNetConfig struct {
	diffusion.ModelConfig
	// PUncond is the probability that a label is replaced by the null
	// class (Ho & Salimans 2022: 0.1 to 0.2), training the unconditional
	// model that classifier-free guidance needs.
	PUncond float32 `json:"p_uncond"`
	Batch   int     `json:"batch"`
	Steps   int     `json:"steps"`
	// AdamW at LR after a linear warmup of Warmup steps (DDPM trains at a
	// constant 2e-4 after 5000 warmup steps; this small model takes more).
	LR          float32 `json:"lr"`
	Warmup      int     `json:"warmup"`
	WeightDecay float32 `json:"weight_decay"`
	Beta1       float32 `json:"beta1"`
	Beta2       float32 `json:"beta2"`
	Clip        float32 `json:"clip,omitempty"` // joint gradient norm bound (0: off)
	EMADecay    float32 `json:"ema_decay"`      // the EMA of the weights that samplers use
	Seed        uint64  `json:"seed"`           // initialisation, batches, labels dropped, noise
	Limit       int     `json:"limit,omitempty"`
	SaveEvery   int     `json:"save_every"` // steps between checkpoints
}

// DefaultUNet is `trainer run --model unet` without flags: the 5.3 M
// parameter U-Net (64-128-256, attention at 8×8) on batches of 128 for
// 20000 steps, linear schedule of 1000 steps, labels dropped with
// probability 0.1, EMA 0.9995.
func DefaultUNet() UNetConfig {
	return UNetConfig{
		ModelConfig: diffusion.ModelConfig{UNet: nn.DefaultUNet(), Schedule: "linear", Timesteps: 1000},
		PUncond:     0.1, Batch: 128, Steps: 20000, LR: 2e-4, Warmup: 500, WeightDecay: 0, Beta1: 0.9, Beta2: 0.999,
		Clip: 1, EMADecay: 0.9995, Seed: 1, SaveEvery: 2000,
	}
}

// Validate checks every field.
func (c UNetConfig) Validate() error {
	if err := c.ModelConfig.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	switch {
	case !(c.PUncond >= 0 && c.PUncond <= 1):
		return fmt.Errorf("%w: --p-uncond %v (want 0 to 1)", ErrConfig, c.PUncond)
	case c.Batch < 1 || c.Batch > 1<<16:
		return fmt.Errorf("%w: --batch %d", ErrConfig, c.Batch)
	case c.Steps < 1:
		return fmt.Errorf("%w: --steps %d", ErrConfig, c.Steps)
	case !(c.LR > 0) || c.LR > 10:
		return fmt.Errorf("%w: --lr %v", ErrConfig, c.LR)
	case c.Warmup < 0:
		return fmt.Errorf("%w: --warmup %d", ErrConfig, c.Warmup)
	case !(c.WeightDecay >= 0):
		return fmt.Errorf("%w: --weight-decay %v", ErrConfig, c.WeightDecay)
	case !(c.Beta1 >= 0 && c.Beta1 < 1 && c.Beta2 >= 0 && c.Beta2 < 1):
		return fmt.Errorf("%w: --beta1 %v, --beta2 %v", ErrConfig, c.Beta1, c.Beta2)
	case !(c.Clip >= 0) || math.IsInf(float64(c.Clip), 1):
		return fmt.Errorf("%w: --clip %v", ErrConfig, c.Clip)
	case !(c.EMADecay >= 0 && c.EMADecay <= 1):
		return fmt.Errorf("%w: --ema-decay %v (want 0 to 1)", ErrConfig, c.EMADecay)
	case c.Limit < 0:
		return fmt.Errorf("%w: --limit %d", ErrConfig, c.Limit)
	case c.SaveEvery < 1:
		return fmt.Errorf("%w: --save-every %d", ErrConfig, c.SaveEvery)
	}
	return nil
}

// LRAt is the learning rate of step it (0-based): linear warmup to LR,
// then constant.
func (c UNetConfig) LRAt(it int) float32 {
	if it < c.Warmup {
		return c.LR * float32(it+1) / float32(c.Warmup+1)
	}
	return c.LR
}

// UNetOptions are the parts of a diffusion run that do not change its numbers.
type UNetOptions struct {
	Alloc     device.Allocator
	Precision ops.Precision // PrecBF16: bf16 activations and GEMM operands
	Graph     bool          // the whole step as one CUDA graph (GPU only)
	Run       string        // buffer name prefix
	Train     *data.Set
	Out       string
	LogEvery  int
	Stdout    io.Writer
	Log       io.Writer
	Progress  io.Writer
	Resume    *ckpt.File
	Step      int
	// Publish, with PublishEvery > 0, makes weight snapshots of the EMA
	// in the pool every PublishEvery steps under PublishPrefix (see
	// diffusion.SnapshotName): a sampler reads them while the run goes on.
	Publish       Publisher
	PublishEvery  int
	PublishPrefix string
}

// Publisher is the pool as a snapshot's home: the pool client.
type Publisher interface {
	// CreateSnapshot returns a new named buffer, unsealed, of size bytes,
	// and the function that seals it.
	CreateSnapshot(name string, size int64) (*device.Buffer, func() error, error)
	// Remove drops a buffer's name.
	Remove(name string) error
}

// UNetStepLine is the JSON line written every LogEvery steps.
type UNetStepLine struct {
	Step       int      `json:"step"`
	Loss       float32  `json:"loss"`
	LR         float32  `json:"lr"`
	ImagesPerS float64  `json:"images_per_s"`
	StepMS     float64  `json:"step_ms"`
	GradNorm   *float32 `json:"grad_norm,omitempty"`
}

// UNetResult says how a run ended.
type UNetResult struct {
	Step        int
	Interrupted bool
	Loss        float32 // of the last logged step
	Elapsed     time.Duration
}

// unetRun is a U-Net, its optimizer, schedule tables and training graph on
// one engine.
type unetRun struct {
	cfg   UNetConfig
	m     *nn.UNet
	opt   *optim.AdamW
	step  *nn.UNetTrainStep
	lr    *tensor.Tensor
	norm  *tensor.Tensor
	grads []*tensor.Tensor
	bufs  []*tensor.Tensor
}

func (u *unetRun) free() {
	if u.step != nil {
		u.step.Free()
	}
	if u.opt != nil {
		u.opt.Free()
	}
	if u.m != nil {
		u.m.Free()
	}
	for _, t := range u.bufs {
		t.Buf.Free()
	}
}

func newUNetRun(e *ops.Engine, a device.Allocator, run string, cfg UNetConfig, prec ops.Precision) (u *unetRun, err error) {
	u = &unetRun{cfg: cfg}
	defer func() {
		if err != nil {
			u.free()
			u = nil
		}
	}()
	if u.m, err = nn.NewUNet(a, run, cfg.UNet, nn.UNetOptions{Grads: true, EMA: true}, cfg.Seed); err != nil {
		return u, fmt.Errorf("building the model: %w", err)
	}
	alloc := func(name string, v []float32) (*tensor.Tensor, error) {
		t, err := tensor.Alloc(a, join(run, name), tensor.F32, len(v))
		if err != nil {
			return nil, err
		}
		u.bufs = append(u.bufs, t)
		return t, t.WriteF32(v)
	}
	sched, err := cfg.NoiseSchedule()
	if err != nil {
		return u, err
	}
	sab, s1 := sched.Tables()
	tsab, err := alloc("acts/sqrt_alpha_bar", sab)
	if err != nil {
		return u, err
	}
	ts1, err := alloc("acts/sqrt_one_minus_alpha_bar", s1)
	if err != nil {
		return u, err
	}
	if u.lr, err = alloc("acts/lr_scale", []float32{1}); err != nil {
		return u, err
	}
	noDecay := make([]bool, len(u.m.Params()))
	for i, p := range u.m.Params() {
		noDecay[i] = p.Value.Rank() < 2
		u.grads = append(u.grads, p.Grad)
	}
	ac := ops.AdamWConfig{LR: cfg.LR, Beta1: cfg.Beta1, Beta2: cfg.Beta2, Eps: 1e-8, WeightDecay: cfg.WeightDecay,
		LRScale: u.lr, NoDecay: noDecay}
	if u.opt, err = optim.NewAdamW(a, run, u.m.Params(), ac); err != nil {
		return u, fmt.Errorf("building the optimizer: %w", err)
	}
	if cfg.Clip > 0 {
		if u.norm, err = alloc("acts/grad_norm", []float32{0}); err != nil {
			return u, err
		}
	}
	cast := tensor.F32
	if prec == ops.PrecBF16 && e.IsGraphCapable() {
		cast = tensor.BF16
	}
	gopts := ops.GraphOptions{Autocast: cast, Train: cfg.UNet.Dropout > 0, Seed: cfg.Seed, Counter: u.opt.Counter()}
	if u.step, err = u.m.RecordTrain(e, a, run, cfg.Batch, gopts, tsab, ts1); err != nil {
		return u, fmt.Errorf("recording the training step: %w", err)
	}
	return u, nil
}

// compute queues one training step: q_sample, forward, loss, backward,
// clipping, AdamW, and the EMA of the weights.
func (u *unetRun) compute(e *ops.Engine, gt *trace.GPUTimer) error {
	g := u.step.Graph
	return runPhases(gt, []namedPhase{
		{spanForward, g.Forward},
		{spanBackward, g.Backward},
		{spanClip, func() error {
			if u.norm == nil {
				return nil
			}
			return e.ClipGradNorm(u.grads, u.cfg.Clip, u.norm)
		}},
		{spanOptimizer, func() error {
			if err := u.opt.Step(e); err != nil {
				return err
			}
			return e.EMA(u.m.FlatEMA(), u.m.Flat(), u.cfg.EMADecay)
		}},
	})
}

// unetBatch fills step's inputs: x0 the images of a batch (pixels p →
// p/127.5 − 1, the border of the padded image −1, the background), y
// their labels with each replaced by the null class with probability
// PUncond, t uniform timesteps. The batch, the dropped labels and the
// timesteps of step come from a PCG seeded by (Seed, step) and a
// permutation of the training set per epoch, so a resumed run draws what
// an uninterrupted one would.
func unetBatch(cfg UNetConfig, set *data.Set, step int, x0 []float32, y, t []int32) {
	B, S := cfg.Batch, cfg.UNet.Size
	n := set.N
	epoch, k := (step*B)/n, (step*B)%n
	perm := epochPerm(cfg.Seed, epoch, n)
	r := rand.New(rand.NewPCG(cfg.Seed^0x756e6574, uint64(step))) // "unet"
	pad := (S - set.Rows) / 2
	padW := (S - set.Cols) / 2
	for b := 0; b < B; b++ {
		if k == n {
			epoch, k = epoch+1, 0
			perm = epochPerm(cfg.Seed, epoch, n)
		}
		i := perm[k]
		k++
		img := x0[b*S*S : (b+1)*S*S]
		for j := range img {
			img[j] = -1
		}
		src := set.Images[i*set.Rows*set.Cols:]
		for row := 0; row < set.Rows; row++ {
			for col := 0; col < set.Cols; col++ {
				img[(row+pad)*S+col+padW] = float32(src[row*set.Cols+col])/127.5 - 1
			}
		}
		y[b] = int32(set.Labels[i])
		if r.Float32() < cfg.PUncond {
			y[b] = int32(cfg.UNet.Classes)
		}
		t[b] = int32(r.IntN(cfg.Timesteps))
	}
}

// epochPerm is the order of the training set in epoch e.
func epochPerm(seed uint64, e, n int) []int {
	return rand.New(rand.NewPCG(seed, uint64(e))).Perm(n)
}

// unetCkpt writes the checkpoint: parameters and EMA in PyTorch's layout,
// the optimizer state (internal layout) under optim/, metadata.
func (u *unetRun) save(path string, step int) error {
	flat, err := u.m.Flat().ReadF32()
	if err != nil {
		return err
	}
	flat = append([]float32(nil), flat...)
	ema, err := u.m.FlatEMA().ReadF32()
	if err != nil {
		return err
	}
	ema = append([]float32(nil), ema...)
	entries, err := diffusion.CheckpointEntries(u.m, flat, ema)
	if err != nil {
		return err
	}
	for _, s := range u.opt.State() {
		b, err := s.Value.Read()
		if err != nil {
			return err
		}
		entries = append(entries, ckpt.Entry{Name: optimPrefix + s.Name, DType: s.Value.DType, Shape: s.Value.Shape, Data: b})
	}
	cb, err := json.Marshal(u.cfg)
	if err != nil {
		return err
	}
	meta := map[string]string{"format": formatName, metaModel: diffusion.ModelName, "config": string(cb),
		"step": strconv.Itoa(step), "seed": strconv.FormatUint(u.cfg.Seed, 10)}
	if err := ckpt.WriteFile(path, entries, meta); err != nil {
		return fmt.Errorf("writing checkpoint: %w", err)
	}
	return nil
}

// load restores parameters, EMA and optimizer state from f.
func (u *unetRun) load(f *ckpt.File) error {
	c := &diffusion.Checkpoint{File: f}
	for _, w := range []struct {
		t   *tensor.Tensor
		ema bool
	}{{u.m.Flat(), false}, {u.m.FlatEMA(), true}} {
		flat, err := c.Flat(u.m, w.ema)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrCheckpoint, err)
		}
		if err := w.t.WriteF32(flat); err != nil {
			return err
		}
	}
	for _, s := range u.opt.State() {
		if err := f.Load(optimPrefix+s.Name, s.Value); err != nil {
			return fmt.Errorf("%w: %v", ErrCheckpoint, err)
		}
	}
	return nil
}

// IsUNetCheckpoint reports whether f was written by a diffusion run.
func IsUNetCheckpoint(f *ckpt.File) bool { return f.Metadata[metaModel] == diffusion.ModelName }

// IsUNetCheckpointFile is IsUNetCheckpoint of the file at path (false when
// it cannot be read).
func IsUNetCheckpointFile(path string) bool {
	f, err := ckpt.ReadFile(path)
	return err == nil && IsUNetCheckpoint(f)
}

// ReadUNetCheckpoint reads a diffusion run's checkpoint: its configuration
// and the steps done.
func ReadUNetCheckpoint(path string) (*ckpt.File, UNetConfig, int, error) {
	var cfg UNetConfig
	c, err := diffusion.ReadCheckpoint(path)
	if err != nil {
		return nil, cfg, 0, err
	}
	if err := json.Unmarshal([]byte(c.File.Metadata["config"]), &cfg); err != nil {
		return nil, cfg, 0, fmt.Errorf("%s: %w: config: %v", path, ErrCheckpoint, err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, cfg, 0, fmt.Errorf("%s: %w", path, err)
	}
	return c.File, cfg, c.Step, nil
}

// publish makes a weight snapshot of the EMA (see diffusion.SnapshotName)
// and drops the name of the one before the previous.
func (u *unetRun) publish(e *ops.Engine, o *UNetOptions, step int, published *[]string) error {
	n := u.m.FlatEMA().Numel()
	name := diffusion.SnapshotName(o.PublishPrefix, step)
	buf, seal, err := o.Publish.CreateSnapshot(name, diffusion.SnapshotBytes(n))
	if err != nil {
		return fmt.Errorf("publishing %s: %w", name, err)
	}
	hdr, err := diffusion.EncodeSnapshotHeader(step, u.cfg.ModelConfig, n)
	if err != nil {
		return err
	}
	hv, err := buf.View(0, diffusion.SnapshotHeader)
	if err != nil {
		return err
	}
	ht, err := tensor.New(hv, tensor.U8, diffusion.SnapshotHeader)
	if err != nil {
		return err
	}
	w, err := diffusion.SnapshotWeights(buf, n)
	if err != nil {
		return err
	}
	if err := e.Do(func() error {
		if err := ht.Write(hdr); err != nil {
			return err
		}
		if err := e.Copy(w, u.m.FlatEMA()); err != nil {
			return err
		}
		return e.Sync()
	}); err != nil {
		return fmt.Errorf("publishing %s: %w", name, err)
	}
	if err := seal(); err != nil {
		return fmt.Errorf("sealing %s: %w", name, err)
	}
	*published = append(*published, name)
	if len(*published) > 2 {
		old := (*published)[0]
		*published = (*published)[1:]
		if err := o.Publish.Remove(old); err != nil {
			return fmt.Errorf("removing %s: %w", old, err)
		}
	}
	return nil
}

// RunUNet trains a diffusion U-Net on o.Train. It stops after the step
// during which ctx is cancelled, writing a checkpoint that RunUNet with
// o.Resume continues from with the same losses.
func RunUNet(ctx context.Context, cfg UNetConfig, o UNetOptions) (UNetResult, error) {
	var res UNetResult
	start := time.Now()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	if o.LogEvery < 1 {
		return res, fmt.Errorf("%w: --log-every %d (want ≥ 1)", ErrConfig, o.LogEvery)
	}
	set := o.Train
	if cfg.Limit > 0 {
		set = set.Limit(cfg.Limit)
	}
	if set.Rows > cfg.UNet.Size || set.Cols > cfg.UNet.Size || cfg.UNet.InChannels != 1 {
		return res, fmt.Errorf("%w: %d×%d grey images into a %d×%d×%d model", ErrConfig, set.Rows, set.Cols, cfg.UNet.Size, cfg.UNet.Size, cfg.UNet.InChannels)
	}
	if set.Classes() > cfg.UNet.Classes {
		return res, fmt.Errorf("%w: %d classes in the data, %d in the model", ErrConfig, set.Classes(), cfg.UNet.Classes)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return res, fmt.Errorf("train: %w", err)
	}
	eng, err := ops.NewEngine(o.Alloc.Device(), ops.Options{Precision: o.Precision})
	if err != nil {
		return res, err
	}
	defer closeEngine(eng)
	u, err := newUNetRun(eng, o.Alloc, o.Run, cfg, o.Precision)
	if err != nil {
		return res, err
	}
	defer u.free()
	step := 0
	if o.Resume != nil {
		if err := u.load(o.Resume); err != nil {
			return res, err
		}
		step = o.Step
	}
	ml, err := openMetrics(o.Out, o.Resume != nil, o.Stdout)
	if err != nil {
		return res, err
	}
	defer ml.close()
	emit := ml.emit
	save := func(step int) error {
		sp := trace.Default().Begin(traceCat, spanCheckpoint)
		defer sp.End()
		return u.save(filepath.Join(o.Out, ModelFile), step)
	}
	s := u.step
	r, err := newStepRunner(eng, []*tensor.Tensor{s.X0, s.T, s.Y, u.lr},
		func(gt *trace.GPUTimer) error { return u.compute(eng, gt) }, o.Graph)
	if err != nil {
		return res, err
	}
	defer r.close()
	if o.Log != nil {
		how := "f32 (the host computes every precision in f32)"
		if eng.IsGraphCapable() {
			how = fmt.Sprintf("%s, CUDA graph %s", precisionName(o.Precision), map[bool]string{true: "on", false: "off"}[o.Graph])
		}
		fmt.Fprintf(o.Log, "trainer: diffusion U-Net of %.2fM parameters (channels %v, %d×%d, %s schedule of %d steps) on %v: %s\n",
			float64(u.m.NumParams())/1e6, cfg.UNet.Channels, cfg.UNet.Size, cfg.UNet.Size, cfg.Schedule, cfg.Timesteps, o.Alloc.Device(), how)
	}
	var published []string
	bar := newProgress(o.Progress, 0, cfg.Steps)
	tk := trace.Default().Main()
	last, lastStep := time.Now(), step
	B, S := cfg.Batch, cfg.UNet.Size
	for ; step < cfg.Steps; step++ {
		sp := tk.Begin(traceCat, spanStep)
		sp.Arg(trace.Int(argStep, int64(step+1)))
		dp := tk.Begin(traceCat, spanData)
		b, err := r.stage()
		if err != nil {
			return res, err
		}
		unetBatch(cfg, set, step, tensor.BytesAs[float32](r.view(b, 0))[:B*S*S],
			tensor.BytesAs[int32](r.view(b, 2))[:B], tensor.BytesAs[int32](r.view(b, 1))[:B])
		lr := cfg.LRAt(step)
		tensor.BytesAs[float32](r.view(b, 3))[0] = lr / cfg.LR
		dp.End()
		if err := r.run(); err != nil {
			return res, fmt.Errorf("step %d: %w", step+1, err)
		}
		done := step + 1
		if done%o.LogEvery == 0 || done == cfg.Steps {
			v, err := s.Loss.ReadF32()
			if err != nil {
				return res, err
			}
			res.Loss = v[0]
			if !(v[0] < 1e30) {
				return res, fmt.Errorf("step %d: the loss is %v", done, v[0])
			}
			now := time.Now()
			k := done - lastStep
			dt := now.Sub(last).Seconds()
			line := UNetStepLine{Step: done, Loss: v[0], LR: lr, ImagesPerS: round(float64(k*B)/dt, 1),
				StepMS: round(dt*1000/float64(k), 3)}
			if u.norm != nil {
				g, err := u.norm.ReadF32()
				if err != nil {
					return res, err
				}
				line.GradNorm = &g[0]
			}
			if err := emit(line); err != nil {
				return res, err
			}
			last, lastStep = now, done
		}
		sp.End()
		bar.update(0, done, res.Loss)
		if o.Publish != nil && o.PublishEvery > 0 && done%o.PublishEvery == 0 {
			if err := u.publish(eng, &o, done, &published); err != nil {
				return res, err
			}
		}
		if done%cfg.SaveEvery == 0 && done < cfg.Steps {
			if err := save(done); err != nil {
				return res, err
			}
			last = time.Now()
		}
		if ctx.Err() != nil && done < cfg.Steps {
			bar.done()
			res.Step, res.Interrupted, res.Elapsed = done, true, time.Since(start)
			return res, errors.Join(save(done), Plot(filepath.Join(o.Out, MetricsFile), filepath.Join(o.Out, PlotFile)))
		}
	}
	bar.done()
	res.Step, res.Elapsed = step, time.Since(start)
	if err := save(step); err != nil {
		return res, err
	}
	return res, Plot(filepath.Join(o.Out, MetricsFile), filepath.Join(o.Out, PlotFile))
}
