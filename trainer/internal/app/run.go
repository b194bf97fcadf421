package app

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cli/devflag"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

const defaultLogEvery = 50

// runFlags are the driver's flags of `trainer run` for model m: where the
// run goes, resuming, logging, the device, and, for a model several ranks
// may train, the gradients' communication.
func runFlags(m driver.Model) []cli.Flag {
	fl := []cli.Flag{
		&cli.StringFlag{Name: "model", Value: m.Name, Usage: modelUsage()},
		&cli.StringFlag{Name: "out", Usage: "DIR: the run directory (default: the --resume directory)"},
		kit.ForceFlag(),
		dataFlag(m.Data),
		&cli.StringFlag{Name: "resume", Usage: "DIR: continue the run in DIR from DIR/state.safetensors, with its flags (--log-every, --precision and --graph too, unless given)"},
		&cli.IntFlag{Name: "log-every", Value: defaultLogEvery, Usage: "steps between loss lines"},
		&cli.StringFlag{Name: "run", DefaultText: "the base name of --out", Usage: "run name, the prefix of pool buffer names"},
	}
	fl = append(fl, driver.DeviceFlags("the training step")...)
	if m.DataParallel {
		fl = append(fl,
			&cli.Float64Flag{Name: "bucket-mb", Value: float64(dist.DefaultBucketBytes) / (1 << 20),
				Usage: "several ranks: size limit in MiB of a gradient bucket, one all-reduce each (PyTorch DDP's bucket_cap_mb; the first bucket is 1 MiB)"},
			&cli.StringFlag{Name: "grad-comm", Value: "f32",
				Usage: "several ranks: f32|bf16 dtype the gradient buckets are all-reduced in (bf16: cast to bf16 and back around the all-reduce, half the bytes, as PyTorch DDP's bf16_compress_hook; the gradients are rounded to bf16; may change on --resume; one process ignores it)"},
			&cli.BoolFlag{Name: "shard-optimizer",
				Usage: "several ranks, AdamW: ZeRO-1, each rank keeps the optimizer state of 1/N of every bucket (gradients reduce-scattered, parameters all-gathered after the update, inside the captured step); checkpoints hold the whole state, so --resume may change it and the number of ranks; one process ignores it"},
			&cli.Float64Flag{Name: "last-bucket-mb", DefaultText: "0: as the plan leaves it",
				Usage: "several ranks: size limit in MiB of the last gradient bucket (the embeddings' and first layers', whose collective nothing overlaps), so the step's exposed tail is small"},
			&cli.StringFlag{Name: "comm-priority", Value: "normal",
				Usage: "several ranks: normal|high priority of the gradients' communication stream (high: NCCL's kernels start ahead of the backward's waiting blocks)"},
			&cli.IntFlag{Name: "nccl-min-ctas", DefaultText: "NCCL's choice", Usage: "several ranks: least CTAs (SMs) of each NCCL collective (NCCL_MIN_CTAS in the environment overrides it)"},
			&cli.IntFlag{Name: "nccl-max-ctas", DefaultText: "NCCL's choice", Usage: "several ranks: most CTAs (SMs) of each NCCL collective, leaving the rest to the backward it overlaps (NCCL_MAX_CTAS in the environment overrides it)"})
	}
	for i, f := range fl {
		v, ok := m.Defaults[f.Names()[0]]
		if !ok {
			continue
		}
		switch f := f.(type) {
		case *cli.StringFlag:
			c := *f
			c.Value = v
			fl[i] = &c
		case *cli.IntFlag:
			c := *f
			if _, err := fmt.Sscan(v, &c.Value); err != nil {
				panic(fmt.Sprintf("trainer: model %s: default --%s %q: %v", m.Name, f.Name, v, err))
			}
			fl[i] = &c
		}
	}
	return append(fl, m.Flags...)
}

// modelUsage is --model's usage: the registered models.
func modelUsage() string {
	var parts []string
	for _, m := range driver.Models() {
		parts = append(parts, m.Name+" ("+m.Summary+")")
	}
	return strings.Join(parts, ", ") + "; each model's flags: trainer run --model NAME --help"
}

func runCommand(sel selection) *cli.Command {
	m := sel.model
	cmd := &cli.Command{
		Name:  "run",
		Usage: "train a model; writes model.safetensors, state.safetensors, metrics.jsonl and loss.png to --out",
		Description: "--model " + m.Name + " (" + m.Summary + "); --data: " + m.Data.Usage + ".\n" +
			"JSON lines on stdout, the same in OUT/metrics.jsonl:\n" + m.Lines + "\n" +
			"OUT/model.safetensors holds the model's tensors alone, under the names of the matching PyTorch\n" +
			"module (a strict load_state_dict takes it); OUT/best.safetensors the same at the lowest validation\n" +
			"loss so far (models with one); OUT/state.safetensors what --resume reads (optimizer state, data\n" +
			"position, the run's flags). SIGINT/SIGTERM: the current step finishes, the checkpoint is written and\n" +
			"trainer exits 0 (an evaluation due then is left for the resumed run); `trainer run --resume OUT`\n" +
			"continues with the same losses and every flag of the run. A progress bar with an ETA goes to\n" +
			"stderr on a terminal (GPUKIT_PROGRESS=always: anywhere).\n" +
			"On a GPU each batch goes through pinned host memory into static input buffers; with --graph on\n" +
			"the whole step is one CUDA graph launch and the host synchronises only to read the loss every\n" +
			"--log-every steps. Loss lines then also carry mfu (model FLOPs utilisation against the GPU's\n" +
			"data-sheet peak for --precision) where the model counts its FLOPs. On the host --graph is a no-op\n" +
			"and --precision computes in f32.\n" +
			"With --trace SOCK (or GPUKIT_TRACE, as tracer record sets it) each step is a span with its phases\n" +
			"and, on a GPU, the GPU time of each graph replay or eager phase; evaluations and checkpoints too.\n" +
			"An --out directory that already holds a run (model.safetensors or metrics.jsonl) is refused unless\n" +
			"--force (or --resume continues it).\n" + otherModels(m.Name, "run"),
		Flags:  runFlags(m),
		Action: func(c *cli.Context) error { return runAction(c, m) },
	}
	if sel.unknown != "" {
		cmd.SkipFlagParsing = true
		cmd.Action = func(*cli.Context) error { return unknownModel(sel.unknown) }
	}
	return cmd
}

// otherModels points to the other models' help of cmd.
func otherModels(name, cmd string) string {
	var o []string
	for _, m := range driver.Models() {
		if m.Name != name {
			o = append(o, "trainer "+cmd+" --model "+m.Name+" --help")
		}
	}
	if len(o) == 0 {
		return ""
	}
	return "Other models' flags: " + strings.Join(o, ", ") + "."
}

func unknownModel(name string) error {
	return kit.Usagef("--model %q: want one of %s", name, strings.Join(driver.Names(), ", "))
}

// runAction is `trainer run` of model m.
func runAction(c *cli.Context, m driver.Model) error {
	// SIGINT/SIGTERM from the start: one during the slow start-up (data,
	// device) ends the run after its first step, with a checkpoint, instead
	// of killing it with nothing written.
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }() // a second signal kills as usual
	if err := kit.NoArgs(c); err != nil {
		return err
	}
	w, err := dist.FromEnv()
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	if w.Distributed() && !m.DataParallel {
		var dp []string
		for _, o := range driver.Models() {
			if o.DataParallel {
				dp = append(dp, o.Name)
			}
		}
		return fmt.Errorf("run: %v: data-parallel training is built for --model %s; run one process for --model %s", w, strings.Join(dp, ", "), m.Name)
	}
	err = runRank(c, ctx, m, w)
	if err != nil && w.Distributed() {
		return fmt.Errorf("%v: %w", w, err) // which rank, and where its world came from
	}
	return err
}

// runRank is the run of rank w (a process alone: dist.Single). It checks
// every flag before the data is read and the device opened.
func runRank(c *cli.Context, ctx context.Context, m driver.Model, w dist.World) error {
	prec, err := devflag.PrecisionOf(c) // --graph and --device are checked as parsed
	if err != nil {
		return err
	}
	if n := c.Int("log-every"); n < 1 {
		return kit.Usagef("--log-every %d: want at least 1", n)
	}
	o := driver.Options{Model: m.Name, Stdout: c.App.Writer, Log: c.App.ErrWriter, Progress: c.App.ErrWriter,
		World: w, OptimizerSocket: c.String("optimizer-socket")}
	if m.DataParallel {
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
		if err := dpFlags(c, &o); err != nil {
			return err
		}
	}
	graph := c.String("graph")
	o.Settings = driver.Settings{LogEvery: c.Int("log-every"), Precision: c.String("precision"), Graph: graph}
	out := c.String("out")
	var task driver.Task
	dir := c.String("resume")
	if dir != "" {
		// The checkpoint fixes the model's flags but those it names
		// resumable; the driver's own are kept unless given.
		for _, fl := range m.Flags {
			if f := fl.Names()[0]; c.IsSet(f) && !slices.Contains(m.Resumable, f) {
				return kit.Usagef("--%s cannot change on --resume: the checkpoint fixes it", f)
			}
		}
		r, err := driver.ReadResume(dir)
		if err != nil {
			return fmt.Errorf("--resume %s: %w", dir, err)
		}
		if r.Model != m.Name {
			return kit.Usagef("--model %s: %s holds a --model %s run", m.Name, dir, r.Model)
		}
		if task, err = m.Resume(c, r.Stored); err != nil {
			return usage(fmt.Errorf("--resume %s: %w", dir, err))
		}
		s := r.Settings
		if !c.IsSet("log-every") && s.LogEvery > 0 {
			o.Settings.LogEvery = s.LogEvery
		}
		if !c.IsSet("precision") && s.Precision != "" {
			if prec, err = ops.ParsePrecision(s.Precision); err != nil {
				return fmt.Errorf("--resume %s: %w: precision %q", dir, driver.ErrCheckpoint, s.Precision)
			}
			o.Settings.Precision = s.Precision
		}
		if !c.IsSet("graph") && (s.Graph == "on" || s.Graph == "off") {
			graph, o.Settings.Graph = s.Graph, s.Graph
		}
		o.Resume = r
		if out == "" {
			out = dir
		}
	} else if task, err = m.New(c); err != nil {
		return usage(err)
	}
	if out == "" {
		return kit.Usagef("run: --out DIR is required (see trainer run --help)")
	}
	// Only rank 0 writes --out (the others would find its files).
	if w.IsMain() && (dir == "" || !sameDir(dir, out)) {
		if err := kit.CheckOut(c, "out", out, driver.ModelFile, driver.MetricsFile); err != nil {
			if driver.Resumable(out) {
				return fmt.Errorf("run: %w (or continue it with --resume %s)", err, out)
			}
			return fmt.Errorf("run: %w", err)
		}
	}
	if o.Run = c.String("run"); o.Run == "" {
		abs, err := filepath.Abs(out)
		if err != nil {
			return err
		}
		o.Run = filepath.Base(abs)
	}
	o.Out, o.Precision, o.Graph, o.LogEvery = out, prec, graph == "on", o.Settings.LogEvery
	process := c.App.Name
	if w.Distributed() {
		process = fmt.Sprintf("%s rank %d", c.App.Name, w.Rank) // a track of its own in the trace
	}
	defer kit.StartTraceAs(c, process)()
	if err := task.Load(w); err != nil {
		return usage(err)
	}
	var closeFn func()
	if w.Distributed() {
		o.Alloc, closeFn, err = rankAllocator(c, w)
	} else {
		o.Alloc, closeFn, err = devflag.Open(c)
	}
	if err != nil {
		return err
	}
	defer closeFn()
	res, err := driver.Run(ctx, task, o)
	if err != nil {
		return usage(err)
	}
	if !w.IsMain() {
		return nil
	}
	model := filepath.Join(out, driver.ModelFile)
	if res.Interrupted {
		fmt.Fprintf(c.App.ErrWriter, "trainer: interrupted after step %d; checkpoint in %s (continue with: trainer run --resume %s)\n", res.Step, out, out)
		return nil
	}
	fmt.Fprintf(c.App.ErrWriter, "trainer: %s\n", task.Summary(res, model))
	return nil
}

// dpFlags reads the data-parallel flags beyond --bucket-mb and
// --grad-comm into o: --shard-optimizer, --last-bucket-mb,
// --comm-priority and NCCL's CTA limits. Bad values are usage errors.
func dpFlags(c *cli.Context, o *driver.Options) error {
	o.ShardOptimizer = c.Bool("shard-optimizer")
	mb := c.Float64("last-bucket-mb")
	if !(mb >= 0 && mb <= 1<<20) {
		return kit.Usagef("--last-bucket-mb %v: want a size in MiB, 0 or above (0: no limit of its own)", mb)
	}
	o.LastBucketBytes = int64(mb * (1 << 20))
	if mb > 0 && o.LastBucketBytes == 0 {
		o.LastBucketBytes = 1
	}
	switch p := c.String("comm-priority"); p {
	case "normal":
	case "high":
		o.HighPriorityComm = true
	default:
		return kit.Usagef("--comm-priority %q: want normal or high", p)
	}
	lo, hi := c.Int("nccl-min-ctas"), c.Int("nccl-max-ctas") // ≥ 0: checked as parsed
	if lo > 0 && hi > 0 && lo > hi {
		return kit.Usagef("--nccl-min-ctas %d is above --nccl-max-ctas %d", lo, hi)
	}
	o.NCCL = nccl.Config{MinCTAs: lo, MaxCTAs: hi}
	return nil
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
