package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/train"
)

// GPT flags of `trainer run --model gpt` (and init).
var lmFlags = func() []cli.Flag {
	d := train.DefaultLM()
	return []cli.Flag{
		&cli.IntFlag{Name: "layers", Value: d.Model.Layers, Usage: "gpt: transformer blocks"},
		&cli.IntFlag{Name: "heads", Value: d.Model.Heads, Usage: "gpt: attention heads (d-model/heads ≤ 128)"},
		&cli.IntFlag{Name: "d-model", Value: d.Model.DModel, Usage: "gpt: embedding width"},
		&cli.IntFlag{Name: "block", Value: d.Model.Block, Usage: "gpt: context length in tokens"},
		&cli.Float64Flag{Name: "dropout", Usage: "gpt: dropout probability after the embeddings and on the residual branches"},
		&cli.BoolFlag{Name: "bias", Usage: "gpt: biases in every Linear and LayerNorm (GPT-2's layout; nanoGPT trains without)"},
		&cli.StringFlag{Name: "gelu", Value: "erf", Usage: "gpt: erf|tanh form of GELU (nn.GELU() is erf)"},
		&cli.IntFlag{Name: "steps", Value: d.Steps, Usage: "gpt: optimizer steps (with --resume: the new total)"},
		&cli.Float64Flag{Name: "min-lr", Value: kit.F32(d.MinLR), Usage: "gpt: learning rate at the end of the cosine decay"},
		&cli.IntFlag{Name: "warmup", Value: d.Warmup, Usage: "gpt: linear warmup steps (default: this or a tenth of --steps, whichever is less)"},
		&cli.IntFlag{Name: "decay-steps", Usage: "gpt: step at which the cosine reaches --min-lr (default --steps)"},
		&cli.Float64Flag{Name: "beta1", Value: kit.F32(d.Beta1), Usage: "gpt: AdamW β1"},
		&cli.Float64Flag{Name: "beta2", Value: kit.F32(d.Beta2), Usage: "gpt: AdamW β2"},
		&cli.IntFlag{Name: "eval-every", Value: d.EvalEvery, Usage: "gpt: steps between validation losses"},
		&cli.IntFlag{Name: "eval-batches", Value: d.EvalBatches, Usage: "gpt: fixed validation batches per evaluation"},
		&cli.Float64Flag{Name: "bucket-mb", Value: float64(dist.DefaultBucketBytes) / (1 << 20),
			Usage: "gpt, several ranks: size limit in MiB of a gradient bucket, one all-reduce each (PyTorch DDP's bucket_cap_mb; the first bucket is 1 MiB)"},
		&cli.StringFlag{Name: "grad-comm", Value: "f32",
			Usage: "gpt, several ranks: f32|bf16 dtype the gradient buckets are all-reduced in (bf16: cast to bf16 and back around the all-reduce, half the bytes, as PyTorch DDP's bf16_compress_hook; the gradients are rounded to bf16; may change on --resume; one process ignores it)"},
	}
}()

// lmFixed may not change on --resume.
var lmFixed = []string{"layers", "heads", "d-model", "block", "dropout", "bias", "gelu", "batch", "lr", "min-lr",
	"warmup", "decay-steps", "beta1", "beta2", "weight-decay", "clip", "seed", "eval-batches",
	"optim", "update-freq", "max-block", "root", "async-roots", "max-staleness", "adam-lr", "rel-eps", "damping", "kl-clip"}

// textPath is --data for a language model: a UTF-8 text file (default:
// Newton's Opticks from the Go distribution).
func textPath(c *cli.Context) (string, error) {
	p := data.DefaultTextPath()
	if c.IsSet("data") {
		p = c.String("data")
	}
	// GPUKIT_DATA_DIR names the MLP's Fashion-MNIST directory; a language
	// model takes the default text instead of that directory.
	if env := os.Getenv("GPUKIT_DATA_DIR"); env != "" && p == env {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			p = data.DefaultTextPath()
		}
	}
	st, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("--data %s: %w", p, err)
	}
	if st.IsDir() {
		return "", fmt.Errorf("--data %s is a directory; --model gpt trains on a UTF-8 text file", p)
	}
	return p, nil
}

// lmConfigFromFlags builds a language-model run's configuration.
func lmConfigFromFlags(c *cli.Context) (train.LMConfig, error) {
	cfg := train.DefaultLM()
	m := &cfg.Model
	m.Layers, m.Heads, m.DModel, m.Block = c.Int("layers"), c.Int("heads"), c.Int("d-model"), c.Int("block")
	m.Dropout, m.Bias = float32(c.Float64("dropout")), c.Bool("bias")
	switch c.String("gelu") {
	case "erf":
	case "tanh":
		m.GELUTanh = true
	default:
		return cfg, fmt.Errorf("--gelu %q: want erf or tanh", c.String("gelu"))
	}
	cfg.Steps, cfg.Warmup = c.Int("steps"), c.Int("warmup")
	if !c.IsSet("warmup") {
		cfg.Warmup = min(cfg.Warmup, cfg.Steps/10) // short runs warm up for a tenth of their steps
	}
	cfg.DecaySteps = cfg.Steps
	if c.IsSet("decay-steps") {
		cfg.DecaySteps = c.Int("decay-steps")
	}
	if c.IsSet("batch") {
		cfg.Batch = c.Int("batch")
	}
	if c.IsSet("lr") {
		cfg.LR = float32(c.Float64("lr"))
	}
	if c.IsSet("weight-decay") {
		cfg.WeightDecay = float32(c.Float64("weight-decay"))
	}
	if c.IsSet("clip") {
		cfg.Clip = float32(c.Float64("clip"))
	}
	cfg.MinLR = float32(c.Float64("min-lr"))
	cfg.Beta1, cfg.Beta2 = float32(c.Float64("beta1")), float32(c.Float64("beta2"))
	cfg.Seed, cfg.EvalEvery, cfg.EvalBatches = c.Uint64("seed"), c.Int("eval-every"), c.Int("eval-batches")
	if c.IsSet("optim") {
		cfg.Optim = c.String("optim")
	}
	cfg.Precond = precondFromFlags(c)
	return cfg, cfg.Validate()
}

// isLM reports whether `trainer run` trains a language model: --model gpt,
// or --resume of a language model's run.
func isLM(c *cli.Context) bool {
	if c.String("model") == "gpt" {
		return true
	}
	dir := c.String("resume")
	return dir != "" && !c.IsSet("model") && train.IsLMCheckpointFile(filepath.Join(dir, train.ModelFile))
}

// mlpOnly are the MLP's flags, which a language-model run refuses.
var mlpOnly = []string{"epochs", "widths", "act", "limit", "momentum", "fuse-backward"}

// runLM is `trainer run --model gpt` (ctx is cancelled by SIGINT/SIGTERM)
// as rank w.Rank of w.Size: with several ranks (trainer launch, torchrun,
// srun) each trains on its rows of every batch on GPU LOCAL_RANK, and
// only rank 0 writes (libgpu/nccl/DATAPARALLEL.md).
func runLM(c *cli.Context, ctx context.Context, prec ops.Precision, w dist.World) error {
	err := runLMRank(c, ctx, prec, w)
	if err != nil && w.Distributed() {
		return fmt.Errorf("%v: %w", w, err) // which rank, and where its world came from
	}
	return err
}

func runLMRank(c *cli.Context, ctx context.Context, prec ops.Precision, w dist.World) error {
	for _, f := range mlpOnly {
		if c.IsSet(f) {
			return kit.Usagef("--%s is an MLP flag; --model gpt takes --steps, --layers, --heads, --d-model, --block (see trainer run --help)", f)
		}
	}
	var err error
	process := c.App.Name
	if w.Distributed() {
		process = fmt.Sprintf("%s rank %d", c.App.Name, w.Rank) // a track of its own in the trace
	}
	defer kit.StartTraceAs(c, process)()
	out := c.String("out")
	o := train.LMOptions{LogEvery: c.Int("log-every"), Stdout: c.App.Writer, Precision: prec, Graph: c.String("graph") == "on",
		World: w}
	mb := c.Float64("bucket-mb")
	if !(mb > 0 && mb <= 1<<20) {
		return kit.Usagef("--bucket-mb %v: want a size in MiB above 0", mb)
	}
	o.BucketBytes = int64(mb * (1 << 20))
	switch gc := c.String("grad-comm"); gc {
	case "f32":
		o.GradComm = tensor.F32
	case "bf16":
		o.GradComm = tensor.BF16
	default:
		return kit.Usagef("--grad-comm %q: want f32 or bf16", gc)
	}
	var cfg train.LMConfig
	var tok *data.CharTokenizer
	if dir := c.String("resume"); dir != "" {
		for _, f := range lmFixed {
			if c.IsSet(f) {
				return kit.Usagef("--%s cannot change on --resume: the checkpoint fixes it", f)
			}
		}
		f, ccfg, ctok, step, err := train.ReadLMCheckpoint(filepath.Join(dir, train.ModelFile))
		if err != nil {
			return fmt.Errorf("--resume %s: %w", dir, err)
		}
		cfg, tok, o.Resume, o.Step = ccfg, ctok, f, step
		if c.IsSet("steps") {
			cfg.Steps = c.Int("steps")
		}
		if c.IsSet("eval-every") {
			cfg.EvalEvery = c.Int("eval-every")
		}
		if out == "" {
			out = dir
		}
	} else if cfg, err = lmConfigFromFlags(c); err != nil {
		return usage(err)
	}
	if out == "" {
		return kit.Usagef("run: --out DIR is required (see trainer run --help)")
	}
	if cfg.Batch%w.Size != 0 {
		return kit.Usagef("--batch %d does not divide by the world size %d: each rank takes --batch/%d rows of every global batch", cfg.Batch, w.Size, w.Size)
	}
	// Only rank 0 writes --out (the others would find its files).
	if dir := c.String("resume"); w.IsMain() && (dir == "" || !sameDir(dir, out)) {
		if err := kit.CheckOut(c, "out", out, train.ModelFile, train.MetricsFile); err != nil {
			return fmt.Errorf("run: %w (or continue it with --resume %s)", err, out)
		}
	}
	path := cfg.Data
	if path == "" || c.IsSet("data") {
		if path, err = textPath(c); err != nil {
			return err
		}
	}
	cfg.Data = path
	if o.Corpus, err = data.LoadText(path, tok); err != nil {
		return fmt.Errorf("--data: %w", err)
	}
	if p := c.String("batches-out"); p != "" && w.IsMain() {
		if err := train.WriteLMBatches(p, cfg, o.Corpus, cfg.Steps); err != nil {
			return fmt.Errorf("--batches-out: %w", err)
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
	var a device.Allocator
	var closeFn func()
	if w.Distributed() {
		a, closeFn, err = rankAllocator(c, w)
	} else {
		a, closeFn, err = allocator(c)
	}
	if err != nil {
		return err
	}
	defer closeFn()
	o.Alloc, o.Log, o.OptimizerSocket = a, c.App.ErrWriter, c.String("optimizer-socket")
	if isTerminal(os.Stderr) {
		o.Progress = c.App.ErrWriter
	}
	res, err := train.RunLM(ctx, cfg, o)
	if err != nil {
		return usage(err)
	}
	if !w.IsMain() {
		return nil
	}
	model := filepath.Join(out, train.ModelFile)
	if res.Interrupted {
		fmt.Fprintf(c.App.ErrWriter, "trainer: interrupted after step %d; checkpoint in %s (continue with: trainer run --resume %s)\n", res.Step, model, out)
		return nil
	}
	unigram := data.UnigramEntropy(o.Corpus.Val, o.Corpus.Tok.Vocab())
	fmt.Fprintf(c.App.ErrWriter, "trainer: %d steps in %.1fs; validation loss %.4f (unigram entropy of the text %.4f); wrote %s\n",
		res.Step, res.Elapsed.Seconds(), res.ValLoss, unigram, model)
	return nil
}

// evalLM prints a language model's validation loss.
func evalLM(c *cli.Context, path string, prec ops.Precision) error {
	f, cfg, tok, _, err := train.ReadLMCheckpoint(path)
	if err != nil {
		return fmt.Errorf("--ckpt: %w", err)
	}
	p := cfg.Data
	if c.IsSet("data") || p == "" {
		if p, err = textPath(c); err != nil {
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
		if err := train.WriteLMEvalBatches(p, cfg, corpus); err != nil {
			return fmt.Errorf("--batches-out: %w", err)
		}
	}
	a, closeFn, err := allocator(c)
	if err != nil {
		return err
	}
	defer closeFn()
	loss, err := train.EvalLM(a, prec, f, cfg, corpus)
	if err != nil {
		return err
	}
	if err := kit.JSONLine(c.App.Writer, map[string]any{"val_loss": loss, "batches": cfg.EvalBatches, "ckpt": path, "data": p}); err != nil {
		return err
	}
	fmt.Fprintf(c.App.ErrWriter, "trainer: %s: validation loss %.4f over %d batches of %s\n", path, loss, cfg.EvalBatches, p)
	return nil
}

func generateCommand() *cli.Command {
	return &cli.Command{
		Name:  "generate",
		Usage: "sample text from a language model's checkpoint, streamed to stdout",
		Description: "Runs the model one token at a time with a key/value cache (on a GPU the decode step is one\n" +
			"replayed CUDA graph) and writes each sampled character to stdout as it comes; the speed goes to\n" +
			"stderr. Sampling is nanoGPT's: logits / --temperature, the --top-k most likely, one draw.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "ckpt", Usage: "(required) model.safetensors of a `trainer run --model gpt`"},
			&cli.StringFlag{Name: "prompt", Usage: "text to continue (default: a newline)"},
			&cli.IntFlag{Name: "tokens", Value: 500, Usage: "tokens to generate"},
			&cli.Float64Flag{Name: "temperature", Value: 0.8, Usage: "divide the logits by this (> 0)"},
			&cli.IntFlag{Name: "top-k", Value: 200, Usage: "sample among the K most likely tokens (0: all)"},
			seedFlag, poolFlag, deviceFlag, graphFlag, precisionFlag,
		},
		Action: func(c *cli.Context) error {
			if err := kit.NoArgs(c); err != nil {
				return err
			}
			if err := kit.Require(c, "ckpt"); err != nil {
				return err
			}
			prec, err := commonChecks(c)
			if err != nil {
				return err
			}
			path := c.String("ckpt")
			f, cfg, tok, _, err := train.ReadLMCheckpoint(path)
			if err != nil {
				return fmt.Errorf("--ckpt: %w", err)
			}
			a, closeFn, err := allocator(c)
			if err != nil {
				return err
			}
			defer closeFn()
			res, err := train.Generate(a, prec, f, cfg, tok, train.GenOptions{Prompt: c.String("prompt"), Tokens: c.Int("tokens"),
				Temperature: c.Float64("temperature"), TopK: c.Int("top-k"), Seed: c.Uint64("seed"), Graph: c.String("graph") == "on"}, c.App.Writer)
			if err != nil {
				return usage(err)
			}
			fmt.Fprintln(c.App.Writer)
			fmt.Fprintf(c.App.ErrWriter, "trainer: %d tokens at %.0f tokens/s\n", res.Tokens, res.TokensPerS)
			return nil
		},
	}
}

// initLM is `trainer init --model gpt`: the initial weights run would draw.
func initLM(c *cli.Context) error {
	cfg, err := lmConfigFromFlags(c)
	if err != nil {
		return usage(err)
	}
	path, err := textPath(c)
	if err != nil {
		return err
	}
	corpus, err := data.LoadText(path, nil)
	if err != nil {
		return fmt.Errorf("--data: %w", err)
	}
	cfg.Data = path
	if err := kit.CheckOut(c, "out", c.String("out")); err != nil {
		return fmt.Errorf("init: %w", err)
	}
	if err := train.InitLM(allocHost(), cfg, corpus.Tok, c.String("out")); err != nil {
		return usage(err)
	}
	fmt.Fprintf(c.App.ErrWriter, "trainer: wrote the initial weights of a %d-layer GPT (vocabulary %d) to %s\n", cfg.Model.Layers, corpus.Tok.Vocab(), c.String("out"))
	return nil
}

// rankAllocator is where rank w of a data-parallel job allocates: its own
// GPU, LOCAL_RANK among the visible ones (dist.World.DeviceOrdinal), in
// this process. Several ranks need a GPU each and NCCL: without them it
// refuses with one line, before anything is allocated.
func rankAllocator(c *cli.Context, w dist.World) (device.Allocator, func(), error) {
	if c.String("pool") != "" || c.String("optimizer-socket") != "" {
		return nil, nil, kit.Usagef("--pool and --optimizer-socket are not built for several ranks; each rank allocates on its GPU")
	}
	switch dev := c.String("device"); dev {
	case "auto", "cuda":
	case "host":
		return nil, nil, errors.New("run: several ranks need a GPU each (--device host)")
	default:
		return nil, nil, kit.Usagef("--device %s: each rank takes GPU LOCAL_RANK (%d); leave --device auto", dev, w.LocalRank)
	}
	visible, err := device.CUDACount()
	if err != nil || visible == 0 {
		why := "no GPU here"
		if err != nil {
			why += " (" + err.Error() + ")"
		}
		return nil, nil, fmt.Errorf("run: several ranks need a GPU each: %s", why)
	}
	if _, err := nccl.LibraryVersion(); err != nil {
		return nil, nil, fmt.Errorf("run: several ranks need NCCL: %w", err)
	}
	ord, err := w.DeviceOrdinal(visible)
	if err != nil {
		return nil, nil, fmt.Errorf("run: %w", err)
	}
	d, err := device.NewCUDA(ord)
	if err != nil {
		return nil, nil, fmt.Errorf("run: cuda:%d: %w", ord, err)
	}
	return device.Local{Dev: d}, func() { d.Close() }, nil
}
