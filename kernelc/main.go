// Command kernelc compiles CUDA C++ with NVRTC to cubins or PTX through the
// compile cache shared with libgpu, reports kernels' resources from a cubin,
// and manages the cache.
package main

import (
	"os"

	"gpukit/kernelc/internal/app"
)

func main() { os.Exit(app.Main(os.Args)) }
