// Package app is the command-line layer of sampler: flags and subcommands only.
package app

import (
	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
)

// New returns the sampler command; run it with kit.Main (gpukit/libgpu/cli).
func New() *cli.App {
	return &cli.App{
		Name:        "sampler",
		Usage:       "diffusion sampling (DDPM, DDIM, DPM-Solver++) with fused step kernels, images and video",
		Description: `sampler runs diffusion sampling loops whose per-step update is one fused kernel. It reads model weights by name from gpupool and writes PNG images or GIF/video frames.`,
		Commands: []*cli.Command{
			kit.NotBuilt("sample", "sample images or frames from a model", "sampler"),
			kit.NotBuilt("bench", "time sampling steps against the reference", "sampler"),
		},
	}
}
