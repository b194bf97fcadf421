// Package app is the command-line layer of sampler: flags and subcommands only.
package app

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// New returns the sampler command.
func New() *cli.App {
	return &cli.App{
		Name:            "sampler",
		Usage:           "diffusion sampling (DDPM, DDIM, DPM-Solver++) with fused step kernels, images and video",
		Description:     `sampler runs diffusion sampling loops whose per-step update is one fused kernel. It reads model weights by name from gpupool and writes PNG images or GIF/video frames.`,
		HideHelpCommand: true,
		ExitErrHandler:  func(*cli.Context, error) {},
		Commands: []*cli.Command{
			later("sample", "sample images or frames from a model", "sampler"),
			later("bench", "time sampling steps against the reference", "sampler"),
		},
	}
}

// later is a subcommand that a later issue builds: it says so and exits 2.
func later(name, usage, issue string) *cli.Command {
	return &cli.Command{
		Name:            name,
		Usage:           usage + " (not built yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return cli.Exit(name+": not built yet; it comes with the issue \""+issue+"\"", 2)
		},
	}
}

// ExitCode maps an error from Run to the process exit status.
func ExitCode(err error) int {
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}
