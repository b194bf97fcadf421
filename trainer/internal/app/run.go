package app

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/libgpu/dist"
	"gpukit/trainer/internal/train"
)

func runCommand() *cli.Command {
	def := train.Default()
	return &cli.Command{
		Name:  "run",
		Usage: "train a model; writes model.safetensors, metrics.jsonl and loss.png to --out",
		Description: "JSON lines on stdout: {step, epoch, loss, lr, samples_per_s, step_ms} every --log-every steps\n" +
			"(loss of that step's batch, epoch 1-based) and {step, epoch, test_accuracy} after every epoch;\n" +
			"the same lines go to OUT/metrics.jsonl. The last partial batch of every epoch is dropped.\n" +
			"SIGINT/SIGTERM: the current step finishes, OUT/model.safetensors gets the model, optimizer state\n" +
			"and data position, and trainer exits 0; `trainer run --resume OUT` continues with the same losses.\n" +
			"On a GPU each batch goes through pinned host memory into static input buffers; with --graph on\n" +
			"the whole step (copy, forward, loss, backward, --clip, optimizer) is one CUDA graph launch and the\n" +
			"host synchronises only to read the loss every --log-every steps. Loss lines then also carry mfu\n" +
			"(model FLOPs utilisation against the GPU's data-sheet peak for --precision).\n" +
			"On the host --graph is a no-op and --precision computes in f32.\n" +
			"With --trace SOCK (or GPUKIT_TRACE, as tracer record sets it) each step is a span with its phases\n" +
			"(data, forward, backward, optimizer, graph replay) and, on a GPU, the GPU time of each graph replay\n" +
			"or eager phase; evaluation and checkpoints too.\n" +
			"An --out directory that already holds a run (model.safetensors or metrics.jsonl) is refused unless\n" +
			"--force (or --resume continues it). --resume keeps the run's --log-every unless it is given.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "out", Usage: "run directory (default: the --resume directory)"},
			kit.ForceFlag(),
			&cli.StringFlag{Name: "model", Value: def.Model, Usage: "mlp (Fashion-MNIST classifier), gpt (character-level language model on --data FILE) or unet (class-conditional diffusion model of Fashion-MNIST)"},
			dataFlag,
			&cli.IntFlag{Name: "epochs", Value: def.Epochs, Usage: "passes over the training set (with --resume: the new total)"},
			&cli.IntFlag{Name: "batch", Value: def.Batch, Usage: "examples per step"},
			&cli.Float64Flag{Name: "lr", Value: kit.F32(def.LR), Usage: "learning rate"},
			&cli.Float64Flag{Name: "weight-decay", Usage: "weight decay (default 0.01, decoupled, for adamw; 0 for sgd and kfac, whose L2 term goes through the momentum)"},
			&cli.Float64Flag{Name: "momentum", Value: kit.F32(def.Momentum), Usage: "SGD momentum"},
			seedFlag, widthsFlag, actFlag,
			&cli.StringFlag{Name: "optim", Value: def.Optim, Usage: "adamw|sgd|shampoo|soap|muon|kfac (libgpu/optim; gpt: kfac reads the Linear layers through the graph's hook)"},
			&cli.IntFlag{Name: "limit", Usage: "train on the first N training examples only (0: all)"},
			&cli.Float64Flag{Name: "clip", Usage: "clip the gradients' joint L2 norm to this (0: off), as torch.nn.utils.clip_grad_norm_"},
			&cli.StringFlag{Name: "batches-out", Usage: "also write every step's batch to this safetensors file (mlp: example indices for bench/reference/mlp.py; gpt: tokens and learning rates for bench/reference/gpt.py parity)"},
			&cli.IntFlag{Name: "log-every", Value: defaultLogEvery, Usage: "steps between loss lines (with --resume: the run's own unless given)"},
			&cli.StringFlag{Name: "resume", Usage: "continue the run in DIR from DIR/model.safetensors"},
			poolFlag,
			&cli.StringFlag{Name: "run", Usage: "run name, the prefix of pool buffer names (default: base name of --out)"},
			&cli.StringFlag{Name: "optimizer-socket", Usage: "run the optimizer in the service at this socket (optimizer serve; needs --pool): one message per step"},
			&cli.IntFlag{Name: "update-freq", Usage: "shampoo, soap, kfac: steps between preconditioner refreshes (default: the optimizer's, 10)"},
			&cli.IntFlag{Name: "max-block", Usage: "shampoo, soap: largest preconditioned block side (default 1024)"},
			&cli.StringFlag{Name: "root", Usage: "shampoo, kfac: eigen|newton, how inverse roots are computed (default eigen)"},
			&cli.BoolFlag{Name: "async-roots", Usage: "shampoo, soap, kfac: compute preconditioners on a second stream, off the step's critical path"},
			&cli.IntFlag{Name: "max-staleness", Usage: "with --async-roots: steps after its refresh a preconditioner is put in use (≤ --update-freq)"},
			&cli.Float64Flag{Name: "adam-lr", Usage: "muon: AdamW's learning rate for embeddings, heads and vectors (default 0.001)"},
			&cli.Float64Flag{Name: "rel-eps", Usage: "shampoo: the roots' ridge relative to each statistic's Frobenius norm (default 1e-6; --root newton runs its products in TF32 from 2e-3, in f32 below)"},
			&cli.Float64Flag{Name: "damping", Usage: "kfac: Tikhonov damping λ, split between the factors by π (default 0.1)"},
			&cli.Float64Flag{Name: "kl-clip", Usage: "kfac: κ, the bound on each step's predicted KL divergence (default 0.001)"},
			deviceFlag, graphFlag, precisionFlag, fuseBackwardFlag, traceFlag,
		}, append(lmFlags, unetFlags...)...),
		Action: runAction,
	}
}

const defaultLogEvery = 50

// modelFlags may not change on --resume: the checkpoint fixes them.
var modelFlags = []string{"model", "batch", "lr", "weight-decay", "momentum", "seed", "widths", "act", "optim", "limit", "clip",
	"update-freq", "max-block", "root", "async-roots", "max-staleness", "adam-lr", "rel-eps", "damping", "kl-clip"}

func runAction(c *cli.Context) error {
	// SIGINT/SIGTERM from the start: one during the slow start-up (data,
	// device) ends the run after its first step, with a checkpoint, instead
	// of killing it with nothing written.
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }() // a second signal kills as usual
	if err := kit.NoArgs(c); err != nil {
		return err
	}
	// Ranks started by trainer launch, torchrun or srun train one GPT
	// together (runLM); the other models would each train alone into the
	// same --out: refuse them.
	w, err := dist.FromEnv()
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	prec, err := commonChecks(c)
	if err != nil {
		return err
	}
	if isLM(c) {
		return runLM(c, ctx, prec, w)
	}
	if w.Distributed() {
		return fmt.Errorf("run: %v: data-parallel training is built for --model gpt; run one process for --model %s", w, c.String("model"))
	}
	if isUNet(c) {
		return runUNet(c, ctx, prec)
	}
	defer setupTrace(c)()
	out := c.String("out")
	opts := train.Options{Stdout: c.App.Writer, Precision: prec, Graph: c.String("graph") == "on",
		FuseBackward: c.Bool("fuse-backward")}
	var cfg train.Config
	if dir := c.String("resume"); dir != "" {
		for _, f := range modelFlags {
			if c.IsSet(f) {
				return kit.Usagef("--%s cannot change on --resume: the checkpoint fixes it", f)
			}
		}
		f, ccfg, pos, err := train.ReadCheckpoint(filepath.Join(dir, train.ModelFile), "relu")
		if err != nil {
			return fmt.Errorf("--resume %s: %w", dir, err)
		}
		cfg, opts.Resume, opts.Pos = ccfg, f, pos
		if c.IsSet("epochs") {
			cfg.Epochs = c.Int("epochs")
		}
		// The run's own cadence (checkpoints before it was stored: the default).
		if c.IsSet("log-every") || cfg.LogEvery == 0 {
			cfg.LogEvery = c.Int("log-every")
		}
		if out == "" {
			out = dir
		}
	} else {
		if cfg, err = configFromFlags(c); err != nil {
			return usage(err)
		}
	}
	if out == "" {
		return kit.Usagef("run: --out DIR is required (see trainer run --help)")
	}
	if err := cfg.Validate(); err != nil {
		return usage(err)
	}
	opts.LogEvery = cfg.LogEvery
	if dir := c.String("resume"); dir == "" || !sameDir(dir, out) {
		if err := kit.CheckOut(c, "out", out, train.ModelFile, train.MetricsFile); err != nil {
			return fmt.Errorf("run: %w (or continue it with --resume %s)", err, out)
		}
	}
	opts.Out = out
	opts.Run = c.String("run")
	if opts.Run == "" {
		abs, err := filepath.Abs(out)
		if err != nil {
			return err
		}
		opts.Run = filepath.Base(abs)
	}
	if opts.Train, opts.Test, err = data.LoadFashionMNIST(c.String("data")); err != nil {
		return fmt.Errorf("%w (install the Debian package dataset-fashion-mnist or pass --data)", err)
	}
	if p := c.String("batches-out"); p != "" {
		if err := train.WriteBatches(p, cfg, opts.Train.N); err != nil {
			return fmt.Errorf("--batches-out: %w", err)
		}
	}
	a, closeFn, err := allocator(c)
	if err != nil {
		return err
	}
	defer closeFn()
	opts.Alloc, opts.OptimizerSocket = a, c.String("optimizer-socket")
	opts.Log = c.App.ErrWriter
	if isTerminal(os.Stderr) {
		opts.Progress = c.App.ErrWriter
	}
	res, err := train.Run(ctx, cfg, opts)
	if err != nil {
		return usage(err)
	}
	model := filepath.Join(out, train.ModelFile)
	if res.Interrupted {
		fmt.Fprintf(c.App.ErrWriter, "trainer: interrupted after step %d; checkpoint in %s (continue with: trainer run --resume %s)\n", res.Pos.Step, model, out)
		return nil
	}
	if res.TestAccuracy >= 0 {
		fmt.Fprintf(c.App.ErrWriter, "trainer: %d epochs, %d steps in %.1fs; test accuracy %.2f%%; wrote %s\n",
			cfg.Epochs, res.Pos.Step, res.Elapsed.Seconds(), 100*res.TestAccuracy, model)
	} else {
		fmt.Fprintf(c.App.ErrWriter, "trainer: nothing to do: the checkpoint already has %d epochs (raise --epochs)\n", cfg.Epochs)
	}
	return nil
}

func configFromFlags(c *cli.Context) (train.Config, error) {
	cfg := train.Default()
	ws, err := parseWidths(c.String("widths"))
	if err != nil {
		return cfg, err
	}
	cfg.Model, cfg.Widths, cfg.Act, cfg.Optim = c.String("model"), ws, c.String("act"), c.String("optim")
	cfg.LR, cfg.Momentum = float32(c.Float64("lr")), float32(c.Float64("momentum"))
	cfg.Batch, cfg.Seed, cfg.Epochs, cfg.Limit = c.Int("batch"), c.Uint64("seed"), c.Int("epochs"), c.Int("limit")
	cfg.Clip = float32(c.Float64("clip"))
	cfg.LogEvery = c.Int("log-every")
	cfg.Precond = precondFromFlags(c)
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

// sameDir reports whether paths a and b name the same directory.
func sameDir(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	if err1 != nil || err2 != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return os.SameFile(fa, fb)
}

// precondFromFlags reads the second-order optimizers' flags.
func precondFromFlags(c *cli.Context) train.OptimConfig {
	return train.OptimConfig{UpdateFreq: c.Int("update-freq"), MaxBlock: c.Int("max-block"), Root: c.String("root"),
		Async: c.Bool("async-roots"), MaxStaleness: c.Int("max-staleness"), AdamLR: float32(c.Float64("adam-lr")),
		RelEps: float32(c.Float64("rel-eps")), Damping: float32(c.Float64("damping")), KLClip: float32(c.Float64("kl-clip"))}
}
