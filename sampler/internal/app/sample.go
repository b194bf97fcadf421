package app

import (
	"fmt"
	"math"
	"time"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/sampler/internal/sample"
)

// sampleCommand is `sampler sample`: images into a PNG grid.
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
			classFlag, randomFlag,
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
			n, batch := c.Int("n"), c.Int("batch")
			// The samples, and a grid and the --save file of them.
			if err := checkMemory("n", int64(n), 3*4*int64(cfg.Size*cfg.Size*cfg.InChannels)); err != nil {
				return err
			}
			bar := newBar(c, "sample", runs(n, batch)*po.Steps)
			defer bar.Done()
			var ms float64 // GPU time on a GPU, else wall time
			start := time.Now()
			out, labels, err := sample.Generate(v.m, sample.GenOptions{Engine: v.e, Alloc: v.a, Plan: po, N: n, Batch: batch,
				Class: v.class, Seed: c.Uint64("seed"), Graph: v.graph, Autocast: v.cast, OnStep: func() { bar.Add(1) },
				OnBatch: func(b sample.BatchStat) error {
					ms += b.MS()
					return kit.JSONLine(c.App.Writer, map[string]any{"batch": b.Batch, "images": b.Images, "gpu_ms": round(float64(b.GPUMS), 3),
						"wall_ms": round(b.WallMS, 3), "images_per_s": round(float64(b.Images)/b.MS()*1000, 2)})
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
