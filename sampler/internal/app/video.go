package app

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/libgpu/diffusion"
	"gpukit/sampler/internal/sample"
)

// videoCommand is `sampler video`: frames into an animated GIF.
func videoCommand() *cli.Command {
	return &cli.Command{
		Name:  "video",
		Usage: "sample a sequence of frames, each from the previous re-noised and blended, into an animated GIF",
		Description: "Frame 0 is sampled from noise with --first-steps steps; every later frame starts from the previous\n" +
			"one re-noised to --strength (a fraction of the T timesteps) and is denoised in --steps steps, its\n" +
			"predicted x0 blended with the previous frame by --blend inside the fused step (temporal blending).\n" +
			"--class all morphs through the classes (frame f gets class f·10/frames). Writes an animated GIF\n" +
			"(--out, played at --fps) frame by frame as the frames are made (a run that fails leaves a GIF of\n" +
			"the frames made so far) and, with --frames-dir, one PNG per frame. JSON lines: one per frame\n" +
			"{frame, class, gpu_ms, wall_ms} and a summary {frames, frames_per_s, frame_ms (median), out}.\n" +
			"One image per frame: the latency of a frame is that of a batch-1 guided sampling loop; --streams B\n" +
			"samples B videos together (a batch of B a step, differing by their noise), each output frame their\n" +
			"frames side by side (2-pixel gaps), and the summary adds images_per_s (B·frames_per_s).\n" +
			"--raw FILE streams each frame as it is made, as raw 8-bit gray pixels (S·S bytes a frame; - is\n" +
			"stdout, and the JSON lines then go to stderr), e.g. for ffmpeg:\n" +
			"  sampler video --ckpt m.safetensors --raw - | ffmpeg -f rawvideo -pix_fmt gray -s 32x32 -r 10 -i - v.mp4\n" +
			"With --raw, --out is optional.\n" +
			"--residual-guidance G guides every frame after the first by residual classifier-free guidance\n" +
			"(R-CFG, StreamDiffusion's self-negative form: the unconditional prediction is the noise that takes\n" +
			"the previous frame to the current sample, so x0 = prev + G·(x0_c − prev)) instead of an\n" +
			"unconditional pass: one U-Net pass a step instead of two. G near 1 to 2 (1: conditional only); the\n" +
			"first frame keeps --guidance-scale.\n" +
			"--classifier M scores the frames as `sampler score` does (each image against its frame's class,\n" +
			"FD-MLP of all frames' images against the test set of --data) and adds accuracy and fd_mlp to the\n" +
			"summary.",
		Flags: append(append(modelFlags(), planFlags()...),
			classFlag, randomFlag,
			kit.IntAtLeast(&cli.IntFlag{Name: "frames", Value: 40, Usage: "frames"}, 1),
			kit.IntAtLeast(&cli.IntFlag{Name: "streams", Value: 1, Usage: "videos sampled together, one batch of this many images a step (their frames side by side)"}, 1),
			kit.FloatWhere(&cli.Float64Flag{Name: "fps", Value: 10, Usage: "GIF frames per second (0 < fps ≤ 100)"},
				"want 0 < fps ≤ 100", func(v float64) bool { return v > 0 && v <= 100 }),
			kit.FloatWhere(&cli.Float64Flag{Name: "strength", Value: 0.5, Usage: "noise level each frame restarts from (0 < T ≤ 1)"},
				"want 0 < T ≤ 1", func(v float64) bool { return v > 0 && v <= 1 }),
			kit.FloatWhere(&cli.Float64Flag{Name: "blend", Value: 0.2, Usage: "weight of the previous frame in each step's predicted x0 (0 ≤ W < 1)"},
				"want 0 ≤ W < 1", func(v float64) bool { return v >= 0 && v < 1 }),
			kit.IntAtLeast(&cli.IntFlag{Name: "first-steps", Value: 20, Usage: "steps of the first frame"}, 1),
			kit.FloatWhere(&cli.Float64Flag{Name: "residual-guidance", Usage: "guide the frames after the first by R-CFG at this scale G > 0, one U-Net pass a step (0: off)"},
				"want G ≥ 0 (0: off)", nonNegative),
			&cli.StringFlag{Name: "classifier", Usage: "score the frames with this `trainer run` MLP (model.safetensors): accuracy and fd_mlp in the summary"},
			dataFlag,
			&cli.StringFlag{Name: "out", Usage: "the animated GIF (required unless --raw is given)"},
			&cli.StringFlag{Name: "raw", Usage: "also stream every frame as raw 8-bit gray pixels to this file as it is made (-: stdout)"},
			&cli.StringFlag{Name: "frames-dir", Usage: "also write frame_NNNN.png files here"},
			kit.ForceFlag(),
		),
		Action: func(c *cli.Context) error {
			raw := c.String("raw")
			var po diffusion.PlanOptions
			var err error
			if raw != "" && !c.IsSet("out") {
				po, err = planOptions(c)
			} else {
				po, err = outAndPlan(c)
			}
			if err != nil {
				return err
			}
			if raw != "-" {
				if err := checkOutFile(c, "raw"); err != nil {
					return err
				}
			}
			fps := c.Float64("fps") // --fps, --strength and --blend are checked as they are parsed
			if !c.IsSet("steps") {
				po.Steps = 4
			}
			first := po
			first.Steps = c.Int("first-steps")
			next := po
			next.Strength, next.Blend = c.Float64("strength"), c.Float64("blend")
			if g := c.Float64("residual-guidance"); g > 0 {
				next.Guidance, next.Residual = g, true
			}
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
			frames, streams := c.Int("frames"), c.Int("streams")
			// Frames are written as they come and not kept; each keeps its
			// time (8 bytes) for the summary's median, and with
			// --classifier its images and labels for the score.
			per := int64(8)
			var scorer *sample.Classifier
			var test *data.Set
			if c.IsSet("classifier") {
				per += int64(streams) * 4 * int64(cfg.Size*cfg.Size*cfg.InChannels+1)
				if scorer, test, err = loadScorer(c, v); err != nil {
					return err
				}
				defer scorer.Free()
			}
			if err := checkMemory("frames", int64(frames), per); err != nil {
				return err
			}
			var kept []float32
			var keptLabels []int32
			if dir != "" {
				// Made now, after every check, so a refused command leaves no directory.
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
			}
			// Raw frames go to --raw as they are made; on stdout they take
			// the JSON lines' place, which then go to stderr.
			jsonOut := c.App.Writer
			var rawOut io.Writer
			switch raw {
			case "":
			case "-":
				rawOut, jsonOut = c.App.Writer, c.App.ErrWriter
			default:
				f, err := os.Create(raw)
				if err != nil {
					return err
				}
				defer f.Close()
				rawOut = f
			}
			// The GIF is written frame by frame: a frame is in the file
			// once OnFrame returns, and the trailer is written however the
			// run ends, so the file is a GIF of the frames made.
			var anim *sample.Animation
			if out := c.String("out"); out != "" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				anim = sample.NewAnimation(f, fps)
				defer anim.Close()
			}
			bar := newBar(c, "video", first.Steps+(frames-1)*po.Steps)
			defer bar.Done()
			var times []float64
			start := time.Now()
			err = sample.Video(v.m, sample.VideoOptions{Engine: v.e, Alloc: v.a, First: first, Next: next, Frames: frames, Streams: streams,
				Class: v.class, Seed: c.Uint64("seed"), Graph: v.graph, Autocast: v.cast, OnStep: func() { bar.Add(1) },
				OnFrame: func(f int, cl int32, img []float32, st sample.BatchStat) error {
					g := sample.Gray(img, 0, cfg.Size)
					if streams > 1 {
						g = sample.Grid(img, streams, cfg.Size, streams)
					}
					if anim != nil {
						if err := anim.Add(g); err != nil {
							return fmt.Errorf("--out: %w", err)
						}
					}
					if rawOut != nil {
						if _, err := rawOut.Write(g.Pix); err != nil {
							return fmt.Errorf("--raw: %w", err)
						}
					}
					if dir != "" {
						if err := sample.WritePNG(sample.FramePath(dir, f), g); err != nil {
							return err
						}
					}
					if f > 0 {
						times = append(times, st.MS())
					}
					if scorer != nil {
						kept = append(kept, img...)
						for range streams {
							keptLabels = append(keptLabels, cl)
						}
					}
					return kit.JSONLine(jsonOut, map[string]any{"frame": f, "class": cl, "gpu_ms": round(float64(st.GPUMS), 3), "wall_ms": round(st.WallMS, 3)})
				}})
			if err != nil {
				return usageErr(err)
			}
			bar.Done()
			if anim != nil {
				if err := anim.Close(); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
			}
			elapsed := time.Since(start).Seconds()
			med := median(times)
			summary := map[string]any{"frames": frames, "frames_per_s": round(float64(frames)/elapsed, 2),
				"streams": streams, "images_per_s": round(float64(streams*frames)/elapsed, 2),
				"frame_ms": round(med, 3), "steps": po.Steps, "strength": next.Strength, "blend": next.Blend,
				"guidance_scale": next.Guidance, "residual_guidance": next.Residual, "out": c.String("out"), "source": v.m.Source}
			if scorer != nil {
				r, err := sample.Score(scorer, kept, keptLabels, len(keptLabels), cfg.Size, test)
				if err != nil {
					return usageErr(err)
				}
				summary["accuracy"], summary["fd_mlp"] = round(r.Accuracy, 4), round(r.FD, 4)
			}
			if err := kit.JSONLine(jsonOut, summary); err != nil {
				return err
			}
			var wrote []string
			if out := c.String("out"); out != "" {
				wrote = append(wrote, out)
			}
			switch raw {
			case "":
			case "-":
				wrote = append(wrote, "stdout (raw)")
			default:
				wrote = append(wrote, raw+" (raw)")
			}
			fmt.Fprintf(c.App.ErrWriter, "sampler: %d frames (%d steps each after the first; median %.2f ms a frame) on %v; wrote %s\n",
				frames, po.Steps, med, v.a.Device(), strings.Join(wrote, " and "))
			return nil
		},
	}
}
