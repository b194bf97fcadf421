// Command sampler: diffusion sampling (DDPM, DDIM, DPM-Solver++) with fused step kernels, images and video
package main

import (
	"fmt"
	"os"

	"gpukit/sampler/internal/app"
)

func main() {
	if err := app.New().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "sampler:", err)
		os.Exit(app.ExitCode(err))
	}
}
