// Package app is the command-line layer of sampler: flags and subcommands
// only, one file per command (sample.go, video.go, score.go). flags.go
// holds the flags they share (the device's from libgpu/cli/devflag) and
// their checks, env.go the set-up every command does (allocator, engine,
// model); the sampling itself is internal/sample's.
package app

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
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

// runs is how many sampling runs of batch images make n.
func runs(n, batch int) int { return (n + batch - 1) / batch }

// newBar is the command's progress bar on stderr (libgpu/cli), counting
// steps (a step of every image of a run at once).
func newBar(c *cli.Context, what string, steps int) *kit.Progress {
	return kit.NewProgress(c.App.ErrWriter, int64(steps), what, "step")
}
