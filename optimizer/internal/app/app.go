// Package app is the command-line layer of optimizer: flags and subcommands only.
package app

import (
	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
)

// New returns the optimizer command; run it with kit.Main (gpukit/libgpu/cli).
func New() *cli.App {
	return &cli.App{
		Name:        "optimizer",
		Usage:       "optimizer service: AdamW, SGD and Shampoo applied in place to shared buffers",
		Description: `optimizer maps parameter and gradient buffers from gpupool and applies AdamW, SGD or Shampoo updates in place; Shampoo's preconditioner roots are computed asynchronously.`,
		Commands: []*cli.Command{
			kit.NotBuilt("serve", "serve optimizer steps over a socket", "optimizer service"),
			kit.NotBuilt("step", "apply one optimizer step to named pool buffers", "optimizer service"),
		},
	}
}
