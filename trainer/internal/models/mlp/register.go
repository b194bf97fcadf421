// Package mlp is the trainer's Fashion-MNIST classifier (`trainer run
// --model mlp`, the default): a multilayer perceptron (libgpu/nn.MLP)
// trained with any of libgpu/optim's optimizers, in-process or in the
// optimizer service, for a number of epochs with the test accuracy after
// each. It registers itself with the run driver (internal/driver).
package mlp

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/ckpt"
	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/trainer/internal/driver"
)

func init() {
	driver.Register(driver.Model{
		Name:    Name,
		Summary: "Fashion-MNIST classifier",
		Default: true,
		Data: driver.DataFlag{Usage: "DIR: directory with the Fashion-MNIST IDX files (gzip'd or not)", Value: data.DefaultDir,
			EnvVars: []string{"GPUKIT_DATA_DIR"}},
		Lines: "{step, epoch, loss, lr, samples_per_s, step_ms[, mfu][, grad_norm]} every --log-every steps (loss of that\n" +
			"step's batch, epoch 1-based; mfu on a GPU of known peak; grad_norm with --clip) and {step, epoch,\n" +
			"test_accuracy[, roots]} after every epoch (roots: the preconditioner refreshes of shampoo, soap, kfac).\n" +
			"The last partial batch of every epoch is dropped.",
		Flags:     flags(),
		Resumable: []string{"epochs", "batches-out", "optimizer-socket"},
		New: func(c *cli.Context) (driver.Task, error) {
			cfg, err := configFromFlags(c)
			if err != nil {
				return nil, err
			}
			return newTask(cfg, c.String("data"), c.String("batches-out"))
		},
		Resume: func(c *cli.Context, s driver.Stored) (driver.Task, error) {
			cfg, err := storedConfig(s.Config)
			if err != nil {
				return nil, err
			}
			if c.IsSet("epochs") {
				cfg.Epochs = c.Int("epochs")
			}
			return newTask(cfg, c.String("data"), c.String("batches-out"))
		},
		Eval: evalCommand(),
		// A checkpoint without trainer metadata that holds fc0.weight (as
		// PyTorch's save_file of bench/reference/mlp.py's model writes).
		Foreign: func(h *ckpt.Header) bool {
			_, ok := h.Tensors["fc0.weight"]
			return ok
		},
	})
}

func flags() []cli.Flag {
	d := Default()
	return append([]cli.Flag{
		&cli.IntFlag{Name: "epochs", Value: d.Epochs, Usage: "passes over the training set (with --resume: the new total)"},
		&cli.IntFlag{Name: "batch", Value: d.Batch, Usage: "examples per step"},
		&cli.Float64Flag{Name: "lr", Value: kit.F32(d.LR), Usage: "learning rate"},
		&cli.Float64Flag{Name: "weight-decay", DefaultText: "0.01 (decoupled) with adamw, shampoo, soap, muon; 0 with sgd and kfac",
			Usage: "weight decay (sgd, kfac: an L2 term that goes through the momentum)"},
		&cli.Float64Flag{Name: "momentum", Value: kit.F32(d.Momentum), Usage: "SGD momentum"},
		&cli.Uint64Flag{Name: "seed", Value: d.Seed, Usage: "seed of the initialisation and of the data order"},
		&cli.StringFlag{Name: "widths", Value: driver.JoinInts(d.Widths), Usage: "layer widths, inputs first and classes last"},
		&cli.StringFlag{Name: "act", Value: d.Act, Usage: "relu|gelu activation between layers"},
		&cli.IntFlag{Name: "limit", Usage: "train on the first N training examples only (0: all)"},
		&cli.Float64Flag{Name: "clip", Usage: "clip the gradients' joint L2 norm to this (0: off), as torch.nn.utils.clip_grad_norm_"},
		&cli.StringFlag{Name: "batches-out", Usage: "FILE: also write every step's example indices to this safetensors file (for bench/reference/mlp.py)"},
		&cli.BoolFlag{Name: "fuse-backward",
			Usage: "fuse each ReLU/GELU derivative into the next layer's dx GEMM (cuBLASLt DRELU/DGELU_BGRAD epilogues); off by default: on an H200 it is faster at 784-256-256-10 but slower at 1024 and 4096 wide (BENCHMARKS.md)"},
	}, driver.OptimFlags(d.Optim, "")...)
}

// configFromFlags is a fresh run's configuration.
func configFromFlags(c *cli.Context) (Config, error) {
	cfg := Default()
	ws, err := driver.ParseInts("widths", c.String("widths"))
	if err != nil {
		return cfg, err
	}
	cfg.Widths, cfg.Act, cfg.Optim = ws, c.String("act"), c.String("optim")
	cfg.LR, cfg.Momentum = float32(c.Float64("lr")), float32(c.Float64("momentum"))
	cfg.Batch, cfg.Seed, cfg.Epochs, cfg.Limit = c.Int("batch"), c.Uint64("seed"), c.Int("epochs"), c.Int("limit")
	cfg.Clip = float32(c.Float64("clip"))
	cfg.FuseBackward = c.Bool("fuse-backward")
	cfg.Precond = driver.OptimFromFlags(c)
	switch {
	case c.IsSet("weight-decay"):
		cfg.WeightDecay = float32(c.Float64("weight-decay"))
	case cfg.Optim == "sgd" || cfg.Optim == "kfac":
		// Both add wd·w to the gradient through the momentum (torch.optim.SGD's
		// L2): per step lr·wd/(1−μ), 0.005 at --lr 0.05, 500× AdamW's
		// decoupled lr·wd at its defaults — and K-FAC's KL clipping scales
		// the gradient's part, not this one.
		cfg.WeightDecay = 0
	}
	return cfg, cfg.Validate()
}

// evalCommand is `trainer eval` of an MLP checkpoint.
func evalCommand() *driver.Command {
	return &driver.Command{
		Usage: "print the test accuracy of an MLP checkpoint",
		Description: "Prints {\"test_accuracy\": A, \"correct\": C, \"examples\": N, \"ckpt\": FILE} on stdout and a human line\n" +
			"on stderr. A checkpoint without trainer metadata (e.g. from PyTorch) is read by the shapes of\n" +
			"fc<i>.weight, with --act between layers.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "batch", Value: 500, Usage: "examples per forward pass"},
			&cli.StringFlag{Name: "act", Value: "relu", Usage: "relu|gelu, for checkpoints without trainer metadata"},
		},
		Action: func(c *cli.Context, in *driver.Input) error {
			if b := c.Int("batch"); b < 1 {
				return kit.Usagef("--batch %d: want at least 1", b)
			}
			if a := c.String("act"); a != "relu" && a != "gelu" {
				return kit.Usagef("--act %q: want relu or gelu", a)
			}
			f, cfg, _, err := ReadCheckpoint(in.Ckpt, c.String("act"))
			if err != nil {
				return fmt.Errorf("--ckpt: %w", err)
			}
			test, err := data.Load(c.String("data"), data.Test)
			if err != nil {
				return fmt.Errorf("%w %s", err, dataHint)
			}
			a, closeFn, err := in.Alloc()
			if err != nil {
				return err
			}
			defer closeFn()
			acc, err := Evaluate(a, in.Precision, f, cfg, c.Int("batch"), test)
			if err != nil {
				return err
			}
			correct := int(acc*float64(test.N) + 0.5)
			if err := kit.JSONLine(c.App.Writer, map[string]any{"test_accuracy": acc, "correct": correct, "examples": test.N, "ckpt": in.Ckpt}); err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "trainer: %s: test accuracy %.2f%% (%d of %d)\n", in.Ckpt, 100*acc, correct, test.N)
			return nil
		},
	}
}
