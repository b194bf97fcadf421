// Package app is the command-line layer of optimizer: flags and subcommands only.
package app

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// New returns the optimizer command.
func New() *cli.App {
	return &cli.App{
		Name:            "optimizer",
		Usage:           "optimizer service: AdamW, SGD and Shampoo applied in place to shared buffers",
		Description:     `optimizer maps parameter and gradient buffers from gpupool and applies AdamW, SGD or Shampoo updates in place; Shampoo's preconditioner roots are computed asynchronously.`,
		HideHelpCommand: true,
		ExitErrHandler:  func(*cli.Context, error) {},
		Commands: []*cli.Command{
			later("serve", "serve optimizer steps over a socket", "optimizer service"),
			later("step", "apply one optimizer step to named pool buffers", "optimizer service"),
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
