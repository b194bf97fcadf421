package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/pool"
	"gpukit/trainer/internal/train"
)

// U-Net flags of `trainer run --model unet` (with --steps, --batch, --lr,
// --warmup, --beta1, --beta2, --weight-decay, --clip, --heads, --dropout,
// --limit, --seed shared with the other models).
var unetFlags = func() []cli.Flag {
	d := train.DefaultUNet()
	return []cli.Flag{
		&cli.StringFlag{Name: "channels", Value: joinInts(d.UNet.Channels), Usage: "unet: widths of the resolution levels (attention at the last)"},
		&cli.IntFlag{Name: "groups", Value: d.UNet.Groups, Usage: "unet: GroupNorm groups (divides every width)"},
		&cli.StringFlag{Name: "schedule", Value: d.Schedule, Usage: "unet: linear|cosine noise schedule"},
		&cli.IntFlag{Name: "timesteps", Value: d.Timesteps, Usage: "unet: diffusion steps T"},
		&cli.Float64Flag{Name: "p-uncond", Value: kit.F32(d.PUncond), Usage: "unet: probability of training a label as the null class (classifier-free guidance)"},
		&cli.Float64Flag{Name: "ema-decay", Value: kit.F32(d.EMADecay), Usage: "unet: decay of the weights' EMA that samplers use"},
		&cli.IntFlag{Name: "save-every", Value: d.SaveEvery, Usage: "unet: steps between checkpoints"},
		&cli.IntFlag{Name: "publish-every", Usage: "unet, with --pool: publish a weight snapshot (the EMA) to the pool every N steps"},
		&cli.StringFlag{Name: "publish-prefix", Usage: "unet: pool name prefix of the snapshots (default <run>/weights): buffers <prefix>@<step>, read by sampler --pool SOCK --weights <prefix>"},
	}
}()

// unetFixed may not change on --resume.
var unetFixed = []string{"channels", "groups", "heads", "dropout", "schedule", "timesteps", "p-uncond", "batch", "lr",
	"warmup", "beta1", "beta2", "weight-decay", "clip", "ema-decay", "seed", "limit"}

// notUNet are flags of the other models, which a diffusion run refuses.
var notUNet = []string{"epochs", "widths", "act", "optim", "momentum", "fuse-backward", "layers", "d-model", "block", "bias",
	"gelu", "min-lr", "decay-steps", "eval-every", "eval-batches", "batches-out"}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// isUNet reports whether `trainer run` trains a diffusion model: --model
// unet, or --resume of such a run.
func isUNet(c *cli.Context) bool {
	if c.String("model") == "unet" {
		return true
	}
	dir := c.String("resume")
	return dir != "" && !c.IsSet("model") && train.IsUNetCheckpointFile(filepath.Join(dir, train.ModelFile))
}

func unetConfigFromFlags(c *cli.Context) (train.UNetConfig, error) {
	cfg := train.DefaultUNet()
	ws, err := parseWidths(c.String("channels"))
	if err != nil {
		return cfg, kit.Usagef("--channels %q: want positive integers separated by commas", c.String("channels"))
	}
	cfg.UNet.Channels = ws
	cfg.UNet.Groups = c.Int("groups")
	if c.IsSet("heads") {
		cfg.UNet.Heads = c.Int("heads")
	}
	cfg.UNet.Dropout = float32(c.Float64("dropout"))
	cfg.Schedule, cfg.Timesteps = c.String("schedule"), c.Int("timesteps")
	cfg.PUncond, cfg.EMADecay = float32(c.Float64("p-uncond")), float32(c.Float64("ema-decay"))
	cfg.SaveEvery = c.Int("save-every")
	for _, f := range []struct {
		name string
		set  func()
	}{
		{"steps", func() { cfg.Steps = c.Int("steps") }},
		{"batch", func() { cfg.Batch = c.Int("batch") }},
		{"lr", func() { cfg.LR = float32(c.Float64("lr")) }},
		{"warmup", func() { cfg.Warmup = c.Int("warmup") }},
		{"beta1", func() { cfg.Beta1 = float32(c.Float64("beta1")) }},
		{"beta2", func() { cfg.Beta2 = float32(c.Float64("beta2")) }},
		{"weight-decay", func() { cfg.WeightDecay = float32(c.Float64("weight-decay")) }},
		{"clip", func() { cfg.Clip = float32(c.Float64("clip")) }},
		{"limit", func() { cfg.Limit = c.Int("limit") }},
	} {
		if c.IsSet(f.name) {
			f.set()
		}
	}
	if !c.IsSet("warmup") {
		cfg.Warmup = min(cfg.Warmup, cfg.Steps/10)
	}
	cfg.Seed = c.Uint64("seed")
	return cfg, cfg.Validate()
}

// poolPublisher publishes snapshots through the pool client a.
type poolPublisher struct{ c *pool.Client }

func (p poolPublisher) CreateSnapshot(name string, size int64) (*device.Buffer, func() error, error) {
	b, err := p.c.Create(name, size, pool.CreateOptions{DType: "u8", Shape: []int64{size}})
	if err != nil {
		return nil, nil, err
	}
	return b.Buffer, b.Seal, nil
}

func (p poolPublisher) Remove(name string) error { return p.c.Remove(name) }

// runUNet is `trainer run --model unet`.
func runUNet(c *cli.Context, ctx context.Context, prec ops.Precision) error {
	for _, f := range notUNet {
		if c.IsSet(f) {
			return kit.Usagef("--%s is not a flag of --model unet (see trainer run --help)", f)
		}
	}
	defer setupTrace(c)()
	out := c.String("out")
	o := train.UNetOptions{LogEvery: c.Int("log-every"), Stdout: c.App.Writer, Precision: prec, Graph: c.String("graph") == "on",
		PublishEvery: c.Int("publish-every")}
	var cfg train.UNetConfig
	if dir := c.String("resume"); dir != "" {
		for _, f := range unetFixed {
			if c.IsSet(f) {
				return kit.Usagef("--%s cannot change on --resume: the checkpoint fixes it", f)
			}
		}
		f, ccfg, step, err := train.ReadUNetCheckpoint(filepath.Join(dir, train.ModelFile))
		if err != nil {
			return fmt.Errorf("--resume %s: %w", dir, err)
		}
		cfg, o.Resume, o.Step = ccfg, f, step
		if c.IsSet("steps") {
			cfg.Steps = c.Int("steps")
		}
		if c.IsSet("save-every") {
			cfg.SaveEvery = c.Int("save-every")
		}
		if out == "" {
			out = dir
		}
	} else {
		var err error
		if cfg, err = unetConfigFromFlags(c); err != nil {
			return usage(err)
		}
	}
	if out == "" {
		return kit.Usagef("run: --out DIR is required (see trainer run --help)")
	}
	if o.PublishEvery < 0 || (o.PublishEvery > 0 && c.String("pool") == "") {
		return kit.Usagef("--publish-every needs --pool (snapshots live in the pool) and a positive step count")
	}
	if dir := c.String("resume"); dir == "" || !sameDir(dir, out) {
		if err := kit.CheckOut(c, "out", out, train.ModelFile, train.MetricsFile); err != nil {
			return fmt.Errorf("run: %w (or continue it with --resume %s)", err, out)
		}
	}
	o.Out = out
	if o.Run = c.String("run"); o.Run == "" {
		abs, err := filepath.Abs(out)
		if err != nil {
			return err
		}
		o.Run = filepath.Base(abs)
	}
	o.PublishPrefix = c.String("publish-prefix")
	if o.PublishPrefix == "" {
		o.PublishPrefix = o.Run + "/weights"
	}
	var err error
	if o.Train, err = data.Load(c.String("data"), data.Train); err != nil {
		return fmt.Errorf("%w (install the Debian package dataset-fashion-mnist or pass --data)", err)
	}
	a, closeFn, err := allocator(c)
	if err != nil {
		return err
	}
	defer closeFn()
	o.Alloc, o.Log = a, c.App.ErrWriter
	if pc, ok := a.(*pool.Client); ok && o.PublishEvery > 0 {
		o.Publish = poolPublisher{c: pc}
	}
	if isTerminal(os.Stderr) {
		o.Progress = c.App.ErrWriter
	}
	res, err := train.RunUNet(ctx, cfg, o)
	if err != nil {
		return usage(err)
	}
	model := filepath.Join(out, train.ModelFile)
	if res.Interrupted {
		fmt.Fprintf(c.App.ErrWriter, "trainer: interrupted after step %d; checkpoint in %s (continue with: trainer run --resume %s)\n", res.Step, model, out)
		return nil
	}
	fmt.Fprintf(c.App.ErrWriter, "trainer: %d steps in %.1fs; last loss %.4f; wrote %s (sample with: sampler sample --ckpt %s)\n",
		res.Step, res.Elapsed.Seconds(), res.Loss, model, model)
	return nil
}
