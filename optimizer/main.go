// Command optimizer: optimizer service: AdamW, SGD and Shampoo applied in place to shared buffers
package main

import (
	"os"

	kit "gpukit/libgpu/cli"
	"gpukit/optimizer/internal/app"
)

func main() { os.Exit(kit.Main(app.New(), os.Args)) }
