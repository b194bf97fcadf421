// Command optimizer: the optimizer service: AdamW, SGD, Shampoo, SOAP, Muon and
// K-FAC applied in place to buffers shared through gpupool (internal/app is
// its command line, internal/server its server).
package main

import (
	"os"

	kit "gpukit/libgpu/cli"
	"gpukit/optimizer/internal/app"
)

func main() { os.Exit(kit.Main(app.New(), os.Args)) }
