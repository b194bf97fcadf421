// Package app is the command-line layer of sampler: flags and subcommands only.
package app

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/pool"
	"gpukit/libgpu/tensor"
	"gpukit/sampler/internal/sample"
)

// New returns the sampler command; run it with kit.Main (gpukit/libgpu/cli).
func New() *cli.App {
	return &cli.App{
		Name:  "sampler",
		Usage: "diffusion sampling (DDPM, DDIM, DPM-Solver++) with fused step kernels, images and video",
		Description: "sampler runs diffusion sampling loops whose per-step update is one fused kernel (the guidance\n" +
			"combine, the scheduler's update and clipping, reading the model output once), the whole loop\n" +
			"captured as one CUDA graph on a GPU. It reads a model trained by `trainer run --model unet` from its\n" +
			"checkpoint or, with --pool, a weight snapshot the training run publishes to gpupool, and writes\n" +
			"PNG grids, animated GIFs and PNG frames; JSON lines with timings go to stdout.",
		Commands: []*cli.Command{
			sampleCommand(),
			videoCommand(),
			scoreCommand(),
			kit.NotBuilt("bench", "time sampling steps against PyTorch",
				"bench/unet.sh does, on a GPU machine (bash build/gpu/run.sh bench/unet.sh; see BENCHMARKS.md)"),
		},
	}
}

// Flags shared by the subcommands.
var (
	ckptFlag    = &cli.StringFlag{Name: "ckpt", Usage: "model.safetensors of a `trainer run --model unet`"}
	poolFlag    = &cli.StringFlag{Name: "pool", Usage: "gpupool socket: allocate there, and with --weights read the weights from a snapshot there"}
	weightsFlag = &cli.StringFlag{Name: "weights", Usage: "with --pool: a snapshot prefix (the newest <prefix>@<step>) or a full name <prefix>@<step>"}
	rawFlag     = &cli.BoolFlag{Name: "raw-weights", Usage: "sample with the checkpoint's raw weights, not their EMA"}
	deviceFlag  = &cli.StringFlag{Name: "device", Value: "auto", Usage: "host, cuda[:N], N or auto (GPU 0 when one answers, else the host); with --pool, the pool's device"}
	graphFlag   = &cli.StringFlag{Name: "graph", Value: "on", Usage: "on|off: capture each sampling loop as one CUDA graph (a no-op on the host)"}
	precFlag    = &cli.StringFlag{Name: "precision", Value: "bf16", Usage: "bf16|tf32|f32: the U-Net's activations and GEMMs (bf16: bf16 activations; the host computes f32)"}
	schedFlag   = &cli.StringFlag{Name: "scheduler", Value: "dpmsolver++", Usage: "ddpm|ddim|dpmsolver++"}
	stepsFlag   = kit.IntAtLeast(&cli.IntFlag{Name: "steps", Value: 20, Usage: "model evaluations (denoising steps)"}, 1)
	etaFlag     = kit.FloatWhere(&cli.Float64Flag{Name: "eta", Usage: "DDIM's η: 0 deterministic, 1 as DDPM's variance"}, "want η ≥ 0", nonNegative)
	guideFlag   = kit.FloatWhere(&cli.Float64Flag{Name: "guidance-scale", Value: 3, Usage: "classifier-free guidance s ≥ 0: ε = ε_u + s(ε_c − ε_u) (1: conditional only, no unconditional pass; 0: unconditional)"},
		"want s ≥ 0 (1: conditional only, 0: unconditional)", nonNegative)
	classFlag  = &cli.StringFlag{Name: "class", Value: "all", Usage: "a class 0..9, null (unconditional), or all (image i gets class i mod 10)"}
	seedFlag   = &cli.Uint64Flag{Name: "seed", Value: 1, Usage: "the noise's seed (Philox key)"}
	noClipFlag = &cli.BoolFlag{Name: "no-clip", Usage: "do not clip the predicted x0 to [-1, 1]"}
	waitFlag   = &cli.DurationFlag{Name: "wait", Value: 30 * time.Second, Usage: "with --pool: how long to wait for a snapshot being written"}
)

func nonNegative(v float64) bool { return v >= 0 }

func modelFlags() []cli.Flag {
	return []cli.Flag{ckptFlag, poolFlag, weightsFlag, rawFlag, deviceFlag, graphFlag, precFlag, seedFlag, waitFlag}
}

func planFlags() []cli.Flag { return []cli.Flag{schedFlag, stepsFlag, etaFlag, guideFlag, noClipFlag} }

// env is what every subcommand sets up: the allocator, engine and model.
type env struct {
	a     device.Allocator
	e     *ops.Engine
	m     *sample.Model
	cast  tensor.DType
	graph bool
	close []func()
}

func (v *env) Close() {
	for i := len(v.close) - 1; i >= 0; i-- {
		v.close[i]()
	}
}

// setup reads the device, model and precision flags.
func setup(c *cli.Context) (*env, error) {
	if err := kit.NoArgs(c); err != nil {
		return nil, err
	}
	g := c.String("graph")
	if g != "on" && g != "off" {
		return nil, kit.Usagef("--graph %q: want on or off", g)
	}
	prec, err := ops.ParsePrecision(c.String("precision"))
	if err != nil {
		return nil, kit.Usagef("--precision %v", err)
	}
	ckpt, weights, sock := c.String("ckpt"), c.String("weights"), c.String("pool")
	switch {
	case ckpt == "" && weights == "":
		return nil, kit.Usagef("--ckpt FILE or --pool SOCK --weights PREFIX is required")
	case ckpt != "" && weights != "":
		return nil, kit.Usagef("--ckpt and --weights are two sources of weights; give one")
	case weights != "" && sock == "":
		return nil, kit.Usagef("--weights names a snapshot in the pool: give --pool SOCK too")
	}
	v := &env{graph: g == "on"}
	ok := false
	defer func() {
		if !ok {
			v.Close()
		}
	}()
	var pc *pool.Client
	if sock != "" {
		if pc, err = pool.Dial(sock); err != nil {
			return nil, fmt.Errorf("--pool %s: %w (is `gpupool serve --socket %s` running?)", sock, err, sock)
		}
		v.close = append(v.close, func() { pc.Close() })
		v.a = pc
	} else {
		a, closeFn, err := localAllocator(c.String("device"))
		if err != nil {
			return nil, err
		}
		v.close = append(v.close, closeFn)
		v.a = a
	}
	if v.e, err = ops.NewEngine(v.a.Device(), ops.Options{Precision: prec}); err != nil {
		return nil, err
	}
	v.close = append(v.close, func() {
		v.e.Close()
	})
	v.cast = tensor.F32
	if prec == ops.PrecBF16 && v.e.IsGraphCapable() {
		v.cast = tensor.BF16
	}
	if weights != "" {
		v.m, err = sample.LoadSnapshot(pc, weights, c.Duration("wait"))
	} else {
		v.m, err = sample.LoadCheckpoint(v.a, ckpt, c.Bool("raw-weights"))
	}
	if err != nil {
		if errors.Is(err, sample.ErrUsage) {
			return nil, fmt.Errorf("%w: %w", kit.ErrUsage, err)
		}
		return nil, err
	}
	v.close = append(v.close, func() { v.m.Free() })
	ok = true
	return v, nil
}

// localAllocator is --device without a pool.
func localAllocator(dev string) (device.Allocator, func(), error) {
	var d device.Device
	switch {
	case dev == "host":
		return device.Local{Dev: device.NewHost()}, func() {}, nil
	case dev == "auto":
		var err error
		if d, err = device.Auto(0); err != nil {
			return nil, nil, fmt.Errorf("--device auto: %w", err)
		}
	default:
		n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimPrefix(dev, "cuda"), ":"))
		if dev == "cuda" {
			n, err = 0, nil
		}
		if err != nil || n < 0 {
			return nil, nil, kit.Usagef("--device %q: want host, cuda[:N], N or auto", dev)
		}
		cd, err := device.NewCUDA(n)
		if err != nil {
			if device.NoGPU(err) {
				return nil, nil, fmt.Errorf("--device %s: no such GPU here (%v); use --device host", dev, err)
			}
			return nil, nil, fmt.Errorf("--device %s: %w", dev, err)
		}
		d = cd
	}
	closeFn := func() {}
	if cl, ok := d.(interface{ Close() error }); ok {
		closeFn = func() { cl.Close() }
	}
	return device.Local{Dev: d}, closeFn, nil
}

// planOptions reads the scheduler flags.
func planOptions(c *cli.Context) (diffusion.PlanOptions, error) {
	sch, err := diffusion.ParseScheduler(c.String("scheduler"))
	if err != nil {
		return diffusion.PlanOptions{}, kit.Usagef("--scheduler %q: want ddpm, ddim or dpmsolver++", c.String("scheduler"))
	}
	// --steps, --eta and --guidance-scale are checked as they are parsed.
	return diffusion.PlanOptions{Scheduler: sch, Steps: c.Int("steps"), Eta: c.Float64("eta"),
		Guidance: c.Float64("guidance-scale"), NoClip: c.Bool("no-clip")}, nil
}

// parseClass reads --class: −1 for all.
func parseClass(c *cli.Context, classes int) (int, error) {
	s := c.String("class")
	switch s {
	case "all":
		return -1, nil
	case "null":
		return classes, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= classes {
		return 0, kit.Usagef("--class %q: want 0..%d, null or all", s, classes-1)
	}
	return n, nil
}

func usageErr(err error) error {
	if err != nil && errors.Is(err, sample.ErrUsage) && !errors.Is(err, kit.ErrUsage) {
		return fmt.Errorf("%w: %w", kit.ErrUsage, err)
	}
	return err
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// outAndPlan checks the required --out (absent, or present without
// --force: a usage error) and returns the sampling plan's options.
func outAndPlan(c *cli.Context) (diffusion.PlanOptions, error) {
	if err := kit.Require(c, "out"); err != nil {
		return diffusion.PlanOptions{}, err
	}
	if err := checkOutFile(c, "out"); err != nil {
		return diffusion.PlanOptions{}, err
	}
	return planOptions(c)
}

func sampleCommand() *cli.Command {
	return &cli.Command{
		Name:  "sample",
		Usage: "sample images from a diffusion model into a PNG grid",
		Description: "Samples --n images (--class: one class, the null class, or all: image i gets class i mod 10) in runs\n" +
			"of --batch (run b draws its noise with counter b: the images depend only on the seed, the batch\n" +
			"size, the classes and the scheduler settings) and writes them as a PNG grid of --cols columns.\n" +
			"With --guidance-scale other than 1, each step runs the conditional and unconditional passes as\n" +
			"one batch of 2·batch. JSON lines on stdout: one per run {batch, images, gpu_ms, wall_ms,\n" +
			"images_per_s} and a summary {images, scheduler, steps, guidance_scale, images_per_s, step_ms,\n" +
			"out, source, train_step}. --save FILE.safetensors also writes the raw samples (f32 [n, S, S, 1]\n" +
			"in [-1, 1]) and labels, e.g. for bench/reference/unet.py compare.",
		Flags: append(append(modelFlags(), planFlags()...),
			classFlag,
			kit.IntAtLeast(&cli.IntFlag{Name: "n", Value: 100, Usage: "images"}, 1),
			kit.IntAtLeast(&cli.IntFlag{Name: "batch", Value: 100, Usage: "images per sampling run"}, 1),
			kit.IntAtLeast(&cli.IntFlag{Name: "cols", Value: 10, Usage: "images per row of the grid"}, 1),
			&cli.StringFlag{Name: "out", Usage: "(required) the PNG grid"},
			&cli.StringFlag{Name: "save", Usage: "also write the samples and labels to this safetensors file"},
			kit.ForceFlag(),
		),
		Action: func(c *cli.Context) error {
			po, err := outAndPlan(c)
			if err != nil {
				return err
			}
			if err := checkOutFile(c, "save"); err != nil {
				return err
			}
			v, err := setup(c)
			if err != nil {
				return err
			}
			defer v.Close()
			cfg := v.m.Config.UNet
			class, err := parseClass(c, cfg.Classes)
			if err != nil {
				return err
			}
			n, batch := c.Int("n"), c.Int("batch")
			// The samples, and a grid and the --save file of them.
			if err := checkMemory("n", int64(n), 3*4*int64(cfg.Size*cfg.Size*cfg.InChannels)); err != nil {
				return err
			}
			bar := newBar(c, "sample", runs(n, batch)*po.Steps)
			defer bar.Done()
			var gpuMS, wall float64
			start := time.Now()
			out, labels, err := sample.Generate(v.m, sample.GenOptions{Engine: v.e, Alloc: v.a, Plan: po, N: n, Batch: batch,
				Class: class, Seed: c.Uint64("seed"), Graph: v.graph, Autocast: v.cast, OnStep: func() { bar.Add(1) },
				OnBatch: func(b sample.BatchStat) error {
					gpuMS += float64(b.GPUMS)
					wall += b.WallMS
					ms := b.WallMS
					if b.GPUMS > 0 {
						ms = float64(b.GPUMS)
					}
					return kit.JSONLine(c.App.Writer, map[string]any{"batch": b.Batch, "images": b.Images, "gpu_ms": round(float64(b.GPUMS), 3),
						"wall_ms": round(b.WallMS, 3), "images_per_s": round(float64(b.Images)/ms*1000, 2)})
				}})
			if err != nil {
				return usageErr(err)
			}
			bar.Done()
			if err := sample.WritePNG(c.String("out"), sample.Grid(out, n, cfg.Size, c.Int("cols"))); err != nil {
				return err
			}
			if p := c.String("save"); p != "" {
				if err := sample.SaveSamples(p, out, labels, cfg.Size, v.m, po, c.Uint64("seed"), c.Int("batch")); err != nil {
					return err
				}
			}
			ms := gpuMS
			if ms == 0 {
				ms = wall
			}
			evals := float64(po.Steps)
			if err := kit.JSONLine(c.App.Writer, map[string]any{"images": n, "scheduler": po.Scheduler.String(), "steps": po.Steps,
				"guidance_scale": po.Guidance, "images_per_s": round(float64(n)/ms*1000, 2),
				"step_ms":   round(ms/evals/math.Ceil(float64(n)/float64(c.Int("batch"))), 4),
				"elapsed_s": round(time.Since(start).Seconds(), 3), "out": c.String("out"), "source": v.m.Source, "train_step": v.m.Step}); err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "sampler: %d images, %d %s steps (guidance %g) on %v: %.1f images/s; wrote %s\n",
				n, po.Steps, po.Scheduler, po.Guidance, v.a.Device(), float64(n)/ms*1000, c.String("out"))
			return nil
		},
	}
}

func videoCommand() *cli.Command {
	return &cli.Command{
		Name:  "video",
		Usage: "sample a sequence of frames, each from the previous re-noised and blended, into an animated GIF",
		Description: "Frame 0 is sampled from noise with --first-steps steps; every later frame starts from the previous\n" +
			"one re-noised to --strength (a fraction of the T timesteps) and is denoised in --steps steps, its\n" +
			"predicted x0 blended with the previous frame by --blend inside the fused step (temporal blending).\n" +
			"--class all morphs through the classes (frame f gets class f·10/frames). Writes an animated GIF\n" +
			"(--out, played at --fps) and, with --frames-dir, one PNG per frame. JSON lines: one per frame\n" +
			"{frame, class, gpu_ms, wall_ms} and a summary {frames, frames_per_s, frame_ms (median), out}.\n" +
			"One image per frame: the latency of a frame is that of a batch-1 guided sampling loop.",
		Flags: append(append(modelFlags(), planFlags()...),
			classFlag,
			kit.IntAtLeast(&cli.IntFlag{Name: "frames", Value: 40, Usage: "frames"}, 1),
			kit.FloatWhere(&cli.Float64Flag{Name: "fps", Value: 10, Usage: "GIF frames per second (0 < fps ≤ 100)"},
				"want 0 < fps ≤ 100", func(v float64) bool { return v > 0 && v <= 100 }),
			kit.FloatWhere(&cli.Float64Flag{Name: "strength", Value: 0.5, Usage: "noise level each frame restarts from (0 < T ≤ 1)"},
				"want 0 < T ≤ 1", func(v float64) bool { return v > 0 && v <= 1 }),
			kit.FloatWhere(&cli.Float64Flag{Name: "blend", Value: 0.2, Usage: "weight of the previous frame in each step's predicted x0 (0 ≤ W < 1)"},
				"want 0 ≤ W < 1", func(v float64) bool { return v >= 0 && v < 1 }),
			kit.IntAtLeast(&cli.IntFlag{Name: "first-steps", Value: 20, Usage: "steps of the first frame"}, 1),
			&cli.StringFlag{Name: "out", Usage: "(required) the animated GIF"},
			&cli.StringFlag{Name: "frames-dir", Usage: "also write frame_NNNN.png files here"},
			kit.ForceFlag(),
		),
		Action: func(c *cli.Context) error {
			po, err := outAndPlan(c)
			if err != nil {
				return err
			}
			fps := c.Float64("fps") // --fps, --strength and --blend are checked as they are parsed
			if !c.IsSet("steps") {
				po.Steps = 4
			}
			first := po
			first.Steps = c.Int("first-steps")
			next := po
			next.Strength, next.Blend = c.Float64("strength"), c.Float64("blend")
			dir := c.String("frames-dir")
			if err := checkOutFile(c, "frames-dir"); err != nil {
				return err
			}
			v, err := setup(c)
			if err != nil {
				return err
			}
			defer v.Close()
			cfg := v.m.Config.UNet
			class, err := parseClass(c, cfg.Classes)
			if err != nil {
				return err
			}
			frames := c.Int("frames")
			// Every frame is kept for the GIF (one byte a pixel) and passes
			// through f32 once.
			if err := checkMemory("frames", int64(frames), 5*int64(cfg.Size*cfg.Size*cfg.InChannels)); err != nil {
				return err
			}
			if dir != "" {
				// Made now, after every check, so a refused command leaves no directory.
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
			}
			bar := newBar(c, "video", first.Steps+(frames-1)*po.Steps)
			defer bar.Done()
			anim := sample.NewAnimation(fps)
			var times []float64
			start := time.Now()
			err = sample.Video(v.m, sample.VideoOptions{Engine: v.e, Alloc: v.a, First: first, Next: next, Frames: frames,
				Class: class, Seed: c.Uint64("seed"), Graph: v.graph, Autocast: v.cast, OnStep: func() { bar.Add(1) },
				OnFrame: func(f int, cl int32, img []float32, st sample.BatchStat) error {
					g := sample.Gray(img, 0, cfg.Size)
					anim.Add(g)
					if dir != "" {
						if err := sample.WritePNG(sample.FramePath(dir, f), g); err != nil {
							return err
						}
					}
					ms := st.WallMS
					if st.GPUMS > 0 {
						ms = float64(st.GPUMS)
					}
					if f > 0 {
						times = append(times, ms)
					}
					return kit.JSONLine(c.App.Writer, map[string]any{"frame": f, "class": cl, "gpu_ms": round(float64(st.GPUMS), 3), "wall_ms": round(st.WallMS, 3)})
				}})
			if err != nil {
				return usageErr(err)
			}
			bar.Done()
			if err := anim.Write(c.String("out")); err != nil {
				return err
			}
			elapsed := time.Since(start).Seconds()
			med := median(times)
			if err := kit.JSONLine(c.App.Writer, map[string]any{"frames": anim.Frames(), "frames_per_s": round(float64(anim.Frames())/elapsed, 2),
				"frame_ms": round(med, 3), "steps": po.Steps, "strength": next.Strength, "blend": next.Blend, "out": c.String("out"),
				"source": v.m.Source}); err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "sampler: %d frames (%d steps each after the first; median %.2f ms a frame) on %v; wrote %s\n",
				anim.Frames(), po.Steps, med, v.a.Device(), c.String("out"))
			return nil
		},
	}
}

// scoreGPU and scoreCPU are score's default sample counts: 10,000 on a
// GPU (the standard figure for FID-style scores), 100 on the CPU, where
// one image of the default U-Net takes seconds.
const (
	scoreGPU = 10000
	scoreCPU = 100
)

func scoreCommand() *cli.Command {
	return &cli.Command{
		Name:  "score",
		Usage: "score samples with a Fashion-MNIST classifier: class-conditional accuracy and FD-MLP",
		Description: "Samples --n images (class i mod 10) as `sample` does, labels them with --classifier (an MLP\n" +
			"trained by `trainer run` on the real data; its input is the centre 28×28 crop as 8-bit pixels),\n" +
			"and reports the fraction whose label is the class asked for, and FD-MLP: the Fréchet distance\n" +
			"between Gaussians fitted to the classifier's penultimate-layer features of the samples and of the\n" +
			"10,000 Fashion-MNIST test images (FID's formula on the MLP's features). --n defaults to 10,000 on\n" +
			"a GPU, the standard figure, and to 100 on the CPU, where each image of the default U-Net takes\n" +
			"seconds (give --n 10000 for the standard figure there too; the bar shows the time left). The\n" +
			"classifier and the data are checked before sampling starts. One JSON line:\n" +
			"{accuracy, fd_mlp, n, scheduler, steps, guidance_scale, images_per_s, source}.",
		Flags: append(append(modelFlags(), planFlags()...),
			&cli.StringFlag{Name: "classifier", Usage: "(required) model.safetensors of a `trainer run` MLP"},
			kit.IntAtLeast(&cli.IntFlag{Name: "n", Usage: "images (at least 2)", DefaultText: fmt.Sprintf("%d on a GPU, %d on the CPU", scoreGPU, scoreCPU)}, 2),
			kit.IntAtLeast(&cli.IntFlag{Name: "batch", Value: 256, Usage: "images per sampling run"}, 1),
			&cli.StringFlag{Name: "data", Value: data.DefaultDir, EnvVars: []string{"GPUKIT_DATA_DIR"}, Usage: "directory with the Fashion-MNIST IDX files"},
		),
		Action: func(c *cli.Context) error {
			if err := kit.Require(c, "classifier"); err != nil {
				return err
			}
			po, err := planOptions(c)
			if err != nil {
				return err
			}
			v, err := setup(c)
			if err != nil {
				return err
			}
			defer v.Close()
			cl, err := sample.LoadClassifier(v.e, v.a, c.String("classifier"))
			if err != nil {
				return fmt.Errorf("--classifier: %w", err)
			}
			defer cl.Free()
			test, err := data.Load(c.String("data"), data.Test)
			if err != nil {
				return fmt.Errorf("%w (install the Debian package dataset-fashion-mnist or pass --data)", err)
			}
			n := c.Int("n")
			if !c.IsSet("n") {
				n = scoreCPU
				if v.e.IsGraphCapable() {
					n = scoreGPU
				}
			}
			size := v.m.Config.UNet.Size
			// The samples, the classifier's inputs and features of them.
			per := 4 * int64(size*size*v.m.Config.UNet.InChannels+28*28+cl.FeatureDim())
			if err := checkMemory("n", int64(n), per); err != nil {
				return err
			}
			batch := c.Int("batch")
			bar := newBar(c, "score", runs(n, batch)*po.Steps)
			defer bar.Done()
			var ms float64
			out, labels, err := sample.Generate(v.m, sample.GenOptions{Engine: v.e, Alloc: v.a, Plan: po, N: n, Batch: batch,
				Class: -1, Seed: c.Uint64("seed"), Graph: v.graph, Autocast: v.cast, OnStep: func() { bar.Add(1) },
				OnBatch: func(b sample.BatchStat) error {
					if b.GPUMS > 0 {
						ms += float64(b.GPUMS)
					} else {
						ms += b.WallMS
					}
					return nil
				}})
			if err != nil {
				return usageErr(err)
			}
			bar.Done()
			r, err := sample.Score(cl, out, labels, n, size, test)
			if err != nil {
				return usageErr(err)
			}
			if err := kit.JSONLine(c.App.Writer, map[string]any{"accuracy": round(r.Accuracy, 4), "fd_mlp": round(r.FD, 4), "n": n,
				"test_accuracy": round(r.TestAccuracy, 4), "scheduler": po.Scheduler.String(), "steps": po.Steps,
				"guidance_scale": po.Guidance, "images_per_s": round(float64(n)/ms*1000, 2), "source": v.m.Source}); err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "sampler: %d samples (%d %s steps, guidance %g): class accuracy %.2f%%, FD-MLP %.3f (classifier: %.2f%% on the test set)\n",
				n, po.Steps, po.Scheduler, po.Guidance, 100*r.Accuracy, r.FD, 100*r.TestAccuracy)
			return nil
		},
	}
}

// runs is how many sampling runs of batch images make n.
func runs(n, batch int) int { return (n + batch - 1) / batch }

// newBar is the command's progress bar on stderr (libgpu/cli), counting
// steps (a step of every image of a run at once).
func newBar(c *cli.Context, what string, steps int) *kit.Progress {
	return kit.NewProgress(c.App.ErrWriter, int64(steps), what, "step")
}

// checkMemory refuses a count (flag's value n) whose images, per bytes
// each on the host, would not fit the memory available now
// (kit.CheckMemory), before sampling starts. The device's share is one
// batch, which its allocator refuses by itself.
func checkMemory(flag string, n, per int64) error {
	return kit.CheckMemory(fmt.Sprintf("--%s %d", flag, n), n*per)
}

// checkOutFile checks an output path flag before any work: its directory
// must exist (a missing one is made by nobody), and an existing file is
// replaced only with --force (kit.CheckOut).
func checkOutFile(c *cli.Context, flag string) error {
	path := c.String(flag)
	if path == "" {
		return nil
	}
	if err := kit.CheckOut(c, flag, path); err != nil && flag != "frames-dir" {
		return err
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("--%s %s: the directory %s does not exist; make it first", flag, path, dir)
	}
	return nil
}
