// Command sampler: diffusion sampling (DDPM, DDIM, DPM-Solver++) with fused step kernels, images and video
package main

import (
	"os"

	kit "gpukit/libgpu/cli"
	"gpukit/sampler/internal/app"
)

func main() { os.Exit(kit.Main(app.New(), os.Args)) }
