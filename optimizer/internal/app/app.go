// Package app is the command-line layer of optimizer: flags and subcommands only.
package app

import (
	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
)

const description = `optimizer maps parameter and gradient buffers from gpupool and applies
AdamW, SGD, Shampoo, SOAP, Muon or K-FAC updates in place, one message per
step (libgpu/optim/service/PROTOCOL.md: a trainer registers its buffers once, with
"trainer run --optimizer-socket SOCK"). GPU work is ordered with the
trainer's through interprocess CUDA events, so neither host waits for the
GPU; Shampoo's, SOAP's and K-FAC's preconditioners can be computed on a
second stream with bounded staleness. The optimizer's state lives in the
pool under the run's names (gpupool ls).`

// New returns the optimizer command; run it with kit.Main (gpukit/libgpu/cli).
func New() *cli.App {
	return &cli.App{
		Name:        "optimizer",
		Usage:       "optimizer service: AdamW, SGD, Shampoo, SOAP, Muon and K-FAC applied in place to shared buffers",
		Description: description,
		Commands: []*cli.Command{
			serveCommand,
			kit.NotBuilt("step", "apply one optimizer step to named pool buffers",
				"a trainer drives the service: trainer run --optimizer-socket SOCK (see optimizer serve --help)"),
		},
	}
}
