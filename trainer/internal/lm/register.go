// Package lm is the trainer's language-model task, shared by every model
// that trains a GPT-shaped network on text (nanoGPT's recipe): the text
// read with a character tokenizer built from it and stored in the
// checkpoint, batches drawn from (seed, step), AdamW with warmup and
// cosine decay (or any libgpu/optim optimizer), validation loss on fixed
// batches, data-parallel training over ranks, generation with a
// key/value cache, and nanoGPT's state-dict names in checkpoints. A model
// package registers a Variant (models/gpt: `--model gpt`; a
// Mixture-of-Experts GPT sets its own network flags and logs its extra
// loss terms) and gets `trainer run`, `eval`, `init` and `generate`.
package lm

import (
	"fmt"
	"math"
	"os"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/libgpu/nn"
	"gpukit/trainer/internal/driver"
)

// Variant is one language model on this task, registered by its package
// (Register).
type Variant struct {
	Name    string // --model NAME
	Summary string // for help: "character-level GPT on any text (nanoGPT's model)"
	Kind    string // what the run's first line calls the model: "GPT"
	// Default is the run without flags (the shape, steps and optimizer
	// settings the flags default to).
	Default Config
	// Flags are the variant's own flags beyond the language model's
	// (--layers, --heads, --steps, --lr, ...), e.g. a Mixture-of-Experts
	// GPT's --experts; Resumable names those a resumed run may change.
	Flags     []cli.Flag
	Resumable []string
	// Configure, when set, sets the variant's part of the network's
	// configuration from its flags (a fresh run; a resumed one keeps its
	// stored configuration).
	Configure func(c *cli.Context, m *nn.GPTConfig) error
	// Terms, when set, are loss terms of the recorded training step the
	// loss lines carry after grad_norm (e.g. aux_loss and z_loss), read
	// when a line is written.
	Terms func(s *nn.GPTStep) []driver.Term
	// Lines, when set, documents those terms for `trainer run --help`.
	Lines string
	// Describe, when set, adds to the run's first line what the variant's
	// network has beyond the GPT's shape (e.g. its experts).
	Describe func(m *nn.GPT, c nn.GPTConfig) string
}

// variants are the registered variants, by name (a checkpoint whose
// metadata "model" is one of them is a language model's).
var variants = map[string]Variant{}

// Register registers v as a model of the trainer (driver.Register) with
// the language model's flags, run, eval, init and generate.
func Register(v Variant) {
	variants[v.Name] = v
	driver.Register(driver.Model{
		Name:    v.Name,
		Summary: v.Summary,
		Data: driver.DataFlag{Usage: "FILE: UTF-8 text to train on (a character tokenizer is built from it and stored in the checkpoint)",
			Value: data.DefaultTextPath()},
		Lines: "{step, loss, lr, tokens_per_s, step_ms[, mfu][, grad_norm]" + termsDoc(v) + "} every --log-every steps and after the\n" +
			"last (loss of that step's batch, averaged over ranks; mfu on a GPU of known peak; grad_norm with\n" +
			"--clip) and {step, val_loss, elapsed_s[, roots]} every --eval-every steps and at the end (the mean\n" +
			"loss over --eval-batches fixed validation batches; the lowest so far is kept as best.safetensors)." + v.Lines,
		Flags:        append(flags(v), v.Flags...),
		Resumable:    append([]string{"steps", "eval-every", "batches-out", "optimizer-socket"}, v.Resumable...),
		DataParallel: true,
		New: func(c *cli.Context) (driver.Task, error) {
			cfg, err := configFromFlags(c, v)
			if err != nil {
				return nil, err
			}
			if cfg.Data, err = textPath(c, v.Name); err != nil {
				return nil, err
			}
			return &task{v: v, cfg: cfg, batchesOut: c.String("batches-out")}, nil
		},
		Resume: func(c *cli.Context, s driver.Stored) (driver.Task, error) {
			cfg, tok, _, err := parseMeta(s.Meta)
			if err != nil {
				return nil, err
			}
			if c.IsSet("steps") {
				cfg.Steps = c.Int("steps")
			}
			if c.IsSet("eval-every") {
				cfg.EvalEvery = c.Int("eval-every")
			}
			if cfg.Data == "" || c.IsSet("data") {
				if cfg.Data, err = textPath(c, v.Name); err != nil {
					return nil, err
				}
			}
			if err := cfg.Validate(); err != nil {
				return nil, err
			}
			return &task{v: v, cfg: cfg, tok: tok, batchesOut: c.String("batches-out")}, nil
		},
		Eval:     evalCommand(v),
		Generate: generateCommand(v),
	})
}

func termsDoc(v Variant) string {
	if v.Lines == "" {
		return ""
	}
	return ", ..."
}

// flags are a language model's flags, with v's defaults.
func flags(v Variant) []cli.Flag {
	d := v.Default
	return append([]cli.Flag{
		&cli.IntFlag{Name: "layers", Value: d.Model.Layers, Usage: "transformer blocks"},
		&cli.IntFlag{Name: "heads", Value: d.Model.Heads, Usage: "attention heads (d-model/heads ≤ 128)"},
		&cli.IntFlag{Name: "d-model", Value: d.Model.DModel, Usage: "embedding width"},
		&cli.IntFlag{Name: "block", Value: d.Model.Block, Usage: "context length in tokens"},
		&cli.Float64Flag{Name: "dropout", Value: kit.F32(d.Model.Dropout), Usage: "dropout probability after the embeddings, on the residual branches and on the attention probabilities"},
		&cli.BoolFlag{Name: "bias", Value: d.Model.Bias, Usage: "biases in every Linear and LayerNorm (GPT-2's layout; nanoGPT trains without)"},
		&cli.StringFlag{Name: "gelu", Value: map[bool]string{false: "erf", true: "tanh"}[d.Model.GELUTanh], Usage: "erf|tanh form of GELU (nn.GELU() is erf)"},
		&cli.IntFlag{Name: "steps", Value: d.Steps, Usage: "optimizer steps (with --resume: the new total)"},
		&cli.IntFlag{Name: "batch", Value: d.Batch, Usage: "sequences per step (the global batch: ranks take equal shares)"},
		&cli.Float64Flag{Name: "lr", Value: kit.F32(d.LR), Usage: "peak learning rate, after the warmup"},
		&cli.Float64Flag{Name: "min-lr", Value: kit.F32(d.MinLR), Usage: "learning rate at the end of the cosine decay"},
		&cli.IntFlag{Name: "warmup", Value: d.Warmup, DefaultText: fmt.Sprintf("%d, or a tenth of --steps when that is less", d.Warmup), Usage: "linear warmup steps"},
		&cli.IntFlag{Name: "decay-steps", DefaultText: "--steps", Usage: "step at which the cosine reaches --min-lr"},
		&cli.Float64Flag{Name: "beta1", Value: kit.F32(d.Beta1), Usage: "AdamW β1"},
		&cli.Float64Flag{Name: "beta2", Value: kit.F32(d.Beta2), Usage: "AdamW β2"},
		&cli.Float64Flag{Name: "weight-decay", Value: kit.F32(d.WeightDecay), Usage: "decoupled weight decay of the weights of rank ≥ 2 but biases (nanoGPT's groups)"},
		&cli.Float64Flag{Name: "clip", Value: kit.F32(d.Clip), Usage: "clip the gradients' joint L2 norm to this (0: off), as torch.nn.utils.clip_grad_norm_"},
		&cli.Uint64Flag{Name: "seed", Value: d.Seed, Usage: "seed of the initialisation, the batches and dropout"},
		&cli.IntFlag{Name: "eval-every", Value: d.EvalEvery, Usage: "steps between validation losses (with --resume: may change)"},
		&cli.IntFlag{Name: "eval-batches", Value: d.EvalBatches, Usage: "fixed validation batches per evaluation"},
		&cli.StringFlag{Name: "batches-out", Usage: "FILE: also write every step's tokens and learning rate to this safetensors file (for the PyTorch reference's parity: bench/reference/gpt.py, moe.py)"},
	}, driver.OptimFlags("adamw", " (kfac reads the Linear layers through the graph's hook)")...)
}

// configFromFlags builds a fresh run's configuration.
func configFromFlags(c *cli.Context, v Variant) (Config, error) {
	cfg := v.Default
	m := &cfg.Model
	m.Layers, m.Heads, m.DModel, m.Block = c.Int("layers"), c.Int("heads"), c.Int("d-model"), c.Int("block")
	m.Dropout, m.Bias = float32(c.Float64("dropout")), c.Bool("bias")
	switch c.String("gelu") {
	case "erf":
		m.GELUTanh = false
	case "tanh":
		m.GELUTanh = true
	default:
		return cfg, driver.Configf("--gelu %q (want erf or tanh)", c.String("gelu"))
	}
	if v.Configure != nil {
		if err := v.Configure(c, m); err != nil {
			return cfg, err
		}
	}
	cfg.Steps, cfg.Warmup = c.Int("steps"), c.Int("warmup")
	if !c.IsSet("warmup") {
		cfg.Warmup = min(cfg.Warmup, cfg.Steps/10) // short runs warm up for a tenth of their steps
	}
	cfg.DecaySteps = cfg.Steps
	if c.IsSet("decay-steps") {
		cfg.DecaySteps = c.Int("decay-steps")
	}
	cfg.Batch = c.Int("batch")
	cfg.LR, cfg.MinLR = float32(c.Float64("lr")), float32(c.Float64("min-lr"))
	cfg.WeightDecay, cfg.Clip = float32(c.Float64("weight-decay")), float32(c.Float64("clip"))
	cfg.Beta1, cfg.Beta2 = float32(c.Float64("beta1")), float32(c.Float64("beta2"))
	cfg.Seed, cfg.EvalEvery, cfg.EvalBatches = c.Uint64("seed"), c.Int("eval-every"), c.Int("eval-batches")
	if c.IsSet("optim") {
		cfg.Optim = c.String("optim")
	}
	cfg.Precond = driver.OptimFromFlags(c)
	return cfg, cfg.Validate()
}

// textPath is --data for a language model: a UTF-8 text file (default:
// Newton's Opticks from the Go distribution).
func textPath(c *cli.Context, model string) (string, error) {
	p := c.String("data")
	if p == "" {
		p = data.DefaultTextPath()
	}
	st, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("--data %s: %w", p, err)
	}
	if st.IsDir() {
		return "", fmt.Errorf("--data %s is a directory; --model %s trains on a UTF-8 text file", p, model)
	}
	return p, nil
}

func nan() float64 { return math.NaN() }

// evalCommand is `trainer eval` of a language model's checkpoint.
func evalCommand(v Variant) *driver.Command {
	return &driver.Command{
		Usage: "print the validation loss of a " + v.Kind + " checkpoint",
		Description: "Prints {\"val_loss\": L, \"batches\": N, \"ckpt\": FILE, \"data\": TEXT}: the mean loss over the run's fixed\n" +
			"validation batches of --data (the batches its val_loss lines use), and a human line on stderr.",
		Data: &driver.DataFlag{Usage: "FILE: UTF-8 text whose validation split is evaluated", DefaultText: "the text the run trained on"},
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "eval-batches", DefaultText: "the run's", Usage: "validation batches"},
			&cli.StringFlag{Name: "batches-out", Usage: "FILE: also write the validation batches to this safetensors file (for bench/reference/gpt.py eval)"},
		},
		Action: func(c *cli.Context, in *driver.Input) error {
			if n := c.Int("eval-batches"); c.IsSet("eval-batches") && n < 1 {
				return kit.Usagef("--eval-batches %d: want at least 1", n)
			}
			f, cfg, tok, _, err := ReadCheckpoint(in.Ckpt)
			if err != nil {
				return fmt.Errorf("--ckpt: %w", err)
			}
			p := cfg.Data
			if c.IsSet("data") || p == "" {
				if p, err = textPath(c, v.Name); err != nil {
					return err
				}
			}
			corpus, err := data.LoadText(p, tok)
			if err != nil {
				return fmt.Errorf("--data: %w", err)
			}
			if c.IsSet("eval-batches") {
				cfg.EvalBatches = c.Int("eval-batches")
			}
			if p := c.String("batches-out"); p != "" {
				if err := WriteEvalBatches(p, cfg, corpus); err != nil {
					return fmt.Errorf("--batches-out: %w", err)
				}
			}
			a, closeFn, err := in.Alloc()
			if err != nil {
				return err
			}
			defer closeFn()
			loss, err := Eval(a, in.Precision, f, cfg, corpus, in.Graph)
			if err != nil {
				return err
			}
			if err := kit.JSONLine(c.App.Writer, map[string]any{"val_loss": loss, "batches": cfg.EvalBatches, "ckpt": in.Ckpt, "data": p}); err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "trainer: %s: validation loss %.4f over %d batches of %s\n", in.Ckpt, loss, cfg.EvalBatches, p)
			return nil
		},
	}
}

// generateCommand is `trainer generate` from a language model's checkpoint.
func generateCommand(v Variant) *driver.Command {
	return &driver.Command{
		Usage: "sample text from a " + v.Kind + " checkpoint, streamed to stdout",
		Description: "Runs the model one token at a time with a key/value cache (on a GPU the decode step is one\n" +
			"replayed CUDA graph) and writes the prompt and each sampled character to stdout as it comes; the\n" +
			"file read and the speed go to stderr. Sampling is nanoGPT's: logits / --temperature, the --top-k\n" +
			"most likely, one draw.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "prompt", DefaultText: "a newline", Usage: "text to continue"},
			&cli.IntFlag{Name: "tokens", Value: 500, Usage: "tokens to generate"},
			&cli.Float64Flag{Name: "temperature", Value: 0.8, Usage: "divide the logits by this (> 0)"},
			&cli.IntFlag{Name: "top-k", Value: 200, Usage: "sample among the K most likely tokens (0: all)"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the sampling (the same seed, prompt and checkpoint give the same text)"},
		},
		Action: func(c *cli.Context, in *driver.Input) error {
			o := GenOptions{Prompt: c.String("prompt"), Tokens: c.Int("tokens"), Temperature: c.Float64("temperature"),
				TopK: c.Int("top-k"), Seed: c.Uint64("seed"), Graph: in.Graph}
			if err := o.validate(); err != nil {
				return fmt.Errorf("%w: %w", kit.ErrUsage, err)
			}
			f, cfg, tok, _, err := ReadCheckpoint(in.Ckpt)
			if err != nil {
				return fmt.Errorf("--ckpt: %w", err)
			}
			if _, err := tok.Encode(o.Prompt); err != nil {
				return kit.Usagef("--prompt: %v", err)
			}
			a, closeFn, err := in.Alloc()
			if err != nil {
				return err
			}
			defer closeFn()
			res, err := Generate(a, in.Precision, f, cfg, tok, o, c.App.Writer)
			if err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer)
			fmt.Fprintf(c.App.ErrWriter, "trainer: %s: %d tokens at %.0f tokens/s\n", in.Ckpt, res.Tokens, res.TokensPerS)
			return nil
		},
	}
}
