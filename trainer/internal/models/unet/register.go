// Package unet is `trainer run --model unet`: a class-conditional
// diffusion U-Net (libgpu/nn.UNet, DDPM's ε-prediction loss) trained on
// Fashion-MNIST with classifier-free guidance's dropped labels and an EMA
// of the weights, which its checkpoints hold for samplers (sampler
// sample --ckpt) and which it can publish to the pool while it trains.
package unet

import (
	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/trainer/internal/driver"
)

func init() {
	driver.Register(driver.Model{
		Name:    Name,
		Summary: "class-conditional diffusion U-Net of Fashion-MNIST, for sampler",
		Data: driver.DataFlag{Usage: "DIR: directory with the Fashion-MNIST IDX files (gzip'd or not)", Value: data.DefaultDir,
			EnvVars: []string{"GPUKIT_DATA_DIR"}},
		Lines: "{step, loss, lr, images_per_s, step_ms[, grad_norm]} every --log-every steps and after the last (loss:\n" +
			"the mean squared error of the predicted noise of that step's batch). model.safetensors holds the EMA\n" +
			"of the weights (what sampler uses); state.safetensors also the raw weights (raw/) and AdamW's state.",
		Flags:     flags(),
		Resumable: []string{"steps", "save-every", "publish-every", "publish-prefix"},
		New: func(c *cli.Context) (driver.Task, error) {
			cfg, err := configFromFlags(c)
			if err != nil {
				return nil, err
			}
			return newTask(c, cfg)
		},
		Resume: func(c *cli.Context, s driver.Stored) (driver.Task, error) {
			cfg, err := storedConfig(s.Config)
			if err != nil {
				return nil, err
			}
			if c.IsSet("steps") {
				cfg.Steps = c.Int("steps")
			}
			if c.IsSet("save-every") {
				cfg.SaveEvery = c.Int("save-every")
			}
			if err := cfg.Validate(); err != nil {
				return nil, err
			}
			return newTask(c, cfg)
		},
	})
}

func flags() []cli.Flag {
	d := Default()
	return []cli.Flag{
		&cli.IntFlag{Name: "steps", Value: d.Steps, Usage: "optimizer steps (with --resume: the new total)"},
		&cli.IntFlag{Name: "batch", Value: d.Batch, Usage: "images per step"},
		&cli.Float64Flag{Name: "lr", Value: kit.F32(d.LR), Usage: "AdamW's learning rate after the warmup"},
		&cli.IntFlag{Name: "warmup", Value: d.Warmup, DefaultText: "500, or a tenth of --steps when that is less", Usage: "linear warmup steps"},
		&cli.Float64Flag{Name: "beta1", Value: kit.F32(d.Beta1), Usage: "AdamW β1"},
		&cli.Float64Flag{Name: "beta2", Value: kit.F32(d.Beta2), Usage: "AdamW β2"},
		&cli.Float64Flag{Name: "weight-decay", Value: kit.F32(d.WeightDecay), Usage: "decoupled weight decay of the weights of rank ≥ 2"},
		&cli.Float64Flag{Name: "clip", Value: kit.F32(d.Clip), Usage: "clip the gradients' joint L2 norm to this (0: off)"},
		&cli.Uint64Flag{Name: "seed", Value: d.Seed, Usage: "seed of the initialisation, the batches, the dropped labels and the noise"},
		&cli.IntFlag{Name: "limit", Usage: "train on the first N training images only (0: all)"},
		&cli.StringFlag{Name: "channels", Value: driver.JoinInts(d.UNet.Channels), Usage: "widths of the resolution levels (attention at the last)"},
		&cli.IntFlag{Name: "groups", Value: d.UNet.Groups, Usage: "GroupNorm groups (divides every width)"},
		&cli.IntFlag{Name: "heads", Value: d.UNet.Heads, Usage: "attention heads"},
		&cli.Float64Flag{Name: "dropout", Value: kit.F32(d.UNet.Dropout), Usage: "dropout probability in the residual blocks"},
		&cli.StringFlag{Name: "schedule", Value: d.Schedule, Usage: "linear|cosine noise schedule"},
		&cli.IntFlag{Name: "timesteps", Value: d.Timesteps, Usage: "diffusion steps T"},
		&cli.Float64Flag{Name: "p-uncond", Value: kit.F32(d.PUncond), Usage: "probability of training a label as the null class (classifier-free guidance)"},
		&cli.Float64Flag{Name: "ema-decay", Value: kit.F32(d.EMADecay), Usage: "decay of the weights' EMA that samplers use"},
		&cli.BoolFlag{Name: "ema-warmup", Value: d.EMAWarmup, Usage: "EMA decay min(--ema-decay, (1+s)/(10+s)) at step s, as diffusers' EMAModel (=false: --ema-decay from the first step)"},
		&cli.IntFlag{Name: "save-every", Value: d.SaveEvery, Usage: "steps between checkpoints"},
		&cli.IntFlag{Name: "publish-every", Usage: "with --pool: publish a weight snapshot (the EMA) to the pool every N steps"},
		&cli.StringFlag{Name: "publish-prefix", DefaultText: "<run>/weights", Usage: "pool name prefix of the snapshots: buffers <prefix>@<step>, read by sampler --pool SOCK --weights <prefix>"},
	}
}

// configFromFlags is a fresh run's configuration.
func configFromFlags(c *cli.Context) (Config, error) {
	cfg := Default()
	ws, err := driver.ParseInts("channels", c.String("channels"))
	if err != nil {
		return cfg, err
	}
	cfg.UNet.Channels, cfg.UNet.Groups, cfg.UNet.Heads = ws, c.Int("groups"), c.Int("heads")
	cfg.UNet.Dropout = float32(c.Float64("dropout"))
	cfg.Schedule, cfg.Timesteps = c.String("schedule"), c.Int("timesteps")
	cfg.PUncond, cfg.EMADecay, cfg.EMAWarmup = float32(c.Float64("p-uncond")), float32(c.Float64("ema-decay")), c.Bool("ema-warmup")
	cfg.SaveEvery = c.Int("save-every")
	cfg.Steps, cfg.Batch, cfg.LR, cfg.Warmup = c.Int("steps"), c.Int("batch"), float32(c.Float64("lr")), c.Int("warmup")
	cfg.Beta1, cfg.Beta2 = float32(c.Float64("beta1")), float32(c.Float64("beta2"))
	cfg.WeightDecay, cfg.Clip, cfg.Limit = float32(c.Float64("weight-decay")), float32(c.Float64("clip")), c.Int("limit")
	if !c.IsSet("warmup") {
		cfg.Warmup = min(cfg.Warmup, cfg.Steps/10)
	}
	cfg.Seed = c.Uint64("seed")
	return cfg, cfg.Validate()
}

// newTask checks the publishing flags and makes the task.
func newTask(c *cli.Context, cfg Config) (*task, error) {
	t := &task{cfg: cfg, dataDir: c.String("data"), publishEvery: c.Int("publish-every"), publishPrefix: c.String("publish-prefix")}
	if t.publishEvery < 0 || (t.publishEvery > 0 && c.String("pool") == "") {
		return nil, kit.Usagef("--publish-every needs --pool (snapshots live in the pool) and a positive step count")
	}
	return t, nil
}
