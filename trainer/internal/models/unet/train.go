package unet

import (
	"fmt"
	"math/rand/v2"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
	"gpukit/trainer/internal/driver"
)

// Checkpoint layout: model.safetensors holds the average of the weights
// (EMA) under the state-dict names of bench/reference/unet.py's UNet in
// PyTorch's layout (conv weights [Cout, Cin, KH, KW]), with metadata
// "weights" = "ema": what samplers use, and what its strict
// load_state_dict takes. The state file adds the raw weights under "raw/"
// and AdamW's state (internal layout) under "optim/".
const (
	rawPrefix   = diffusion.RawPrefix
	optimPrefix = "optim/"
)

// unetRun is a U-Net, its optimizer, schedule tables and training graph on
// one engine.
type unetRun struct {
	cfg   Config
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

func newUNetRun(e *ops.Engine, a device.Allocator, run string, cfg Config, prec ops.Precision) (u *unetRun, err error) {
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
		t, err := tensor.Alloc(a, driver.Join(run, name), tensor.F32, len(v))
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
// clipping and AdamW. (The average of the weights follows, eagerly:
// ema, whose decay changes with the step.)
func (u *unetRun) compute(e *ops.Engine, gt *trace.GPUTimer) error {
	g := u.step.Graph
	return driver.RunPhases(gt, []driver.NamedPhase{
		{Name: driver.SpanForward, F: g.Forward},
		{Name: driver.SpanBackward, F: g.Backward},
		{Name: driver.SpanClip, F: func() error {
			if u.norm == nil {
				return nil
			}
			return e.ClipGradNorm(u.grads, u.cfg.Clip, u.norm)
		}},
		{Name: driver.SpanOptimizer, F: func() error { return u.opt.Step(e) }},
	})
}

// ema updates the average of the weights after step s (0-based) with
// the decay of that step (Config.EMADecayAt).
func (u *unetRun) ema(e *ops.Engine, s int, gt *trace.GPUTimer) error {
	p := driver.BeginPhase(gt, driver.SpanEMA)
	err := e.EMA(u.m.FlatEMA(), u.m.Flat(), u.cfg.EMADecayAt(s))
	p.End()
	return err
}

// batch fills step's inputs: x0 the images of a batch (pixels p →
// p/127.5 − 1, the border of the padded image −1, the background), y
// their labels with each replaced by the null class with probability
// PUncond, t uniform timesteps. The batch, the dropped labels and the
// timesteps of step come from a PCG seeded by (Seed, step) and a
// permutation of the training set per epoch, so a resumed run draws what
// an uninterrupted one would.
func batch(cfg Config, set *data.Set, step int, x0 []float32, y, t []int32) {
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

// checkpoint is the EMA (Model, PyTorch's layout), the raw weights and
// AdamW's state (State), and the metadata.
func (u *unetRun) checkpoint() (driver.Checkpoint, error) {
	var ck driver.Checkpoint
	flat, err := u.m.Flat().ReadF32()
	if err != nil {
		return ck, err
	}
	flat = append([]float32(nil), flat...)
	ema, err := u.m.FlatEMA().ReadF32()
	if err != nil {
		return ck, err
	}
	ema = append([]float32(nil), ema...)
	if ck.Model, err = diffusion.CheckpointEntries(u.m, ema, nil); err != nil {
		return ck, err
	}
	raw, err := diffusion.CheckpointEntries(u.m, flat, nil)
	if err != nil {
		return ck, err
	}
	for _, e := range raw {
		e.Name = rawPrefix + e.Name
		ck.State = append(ck.State, e)
	}
	for _, s := range u.opt.State() {
		b, err := s.Value.Read()
		if err != nil {
			return ck, err
		}
		ck.State = append(ck.State, ckpt.Entry{Name: optimPrefix + s.Name, DType: s.Value.DType, Shape: s.Value.Shape, Data: b})
	}
	ck.Meta = meta(u.cfg)
	return ck, nil
}

// meta is the metadata of a U-Net's checkpoint files besides the
// driver's: the seed, and that the weights under plain names are the EMA.
func meta(cfg Config) map[string]string {
	return map[string]string{"seed": fmt.Sprint(cfg.Seed), diffusion.MetaWeights: diffusion.WeightsEMA}
}

// load restores the EMA, the raw weights and the optimizer state from a
// state file.
func (u *unetRun) load(f *ckpt.File) error {
	c := &diffusion.Checkpoint{File: f}
	for _, w := range []struct {
		t   *tensor.Tensor
		ema bool
	}{{u.m.Flat(), false}, {u.m.FlatEMA(), true}} {
		flat, err := c.Flat(u.m, w.ema)
		if err != nil {
			return fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
		if err := w.t.WriteF32(flat); err != nil {
			return err
		}
	}
	for _, s := range u.opt.State() {
		if err := f.Load(optimPrefix+s.Name, s.Value); err != nil {
			return fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
	}
	return nil
}

// Publisher is the pool as a snapshot's home.
type Publisher interface {
	// CreateSnapshot returns a new named buffer, unsealed, of size bytes,
	// and the function that seals it.
	CreateSnapshot(name string, size int64) (*device.Buffer, func() error, error)
	// Remove drops a buffer's name.
	Remove(name string) error
}

// poolPublisher publishes snapshots through a pool client.
type poolPublisher struct{ c *pool.Client }

func (p poolPublisher) CreateSnapshot(name string, size int64) (*device.Buffer, func() error, error) {
	b, err := p.c.Create(name, size, pool.CreateOptions{DType: "u8", Shape: []int64{size}})
	if err != nil {
		return nil, nil, err
	}
	return b.Buffer, b.Seal, nil
}

func (p poolPublisher) Remove(name string) error { return p.c.Remove(name) }

// publish makes a weight snapshot of the EMA (see diffusion.SnapshotName)
// under prefix and drops the name of the one before the previous.
func (u *unetRun) publish(e *ops.Engine, pub Publisher, prefix string, step int, published *[]string) error {
	n := u.m.FlatEMA().Numel()
	name := diffusion.SnapshotName(prefix, step)
	buf, seal, err := pub.CreateSnapshot(name, diffusion.SnapshotBytes(n))
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
		if err := pub.Remove(old); err != nil {
			return fmt.Errorf("removing %s: %w", old, err)
		}
	}
	return nil
}
