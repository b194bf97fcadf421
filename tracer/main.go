// Command tracer: one timeline across all gpukit tools, as Chrome trace JSON for Perfetto
package main

import (
	"os"

	kit "gpukit/libgpu/cli"
	"gpukit/tracer/internal/app"
)

func main() { os.Exit(kit.Main(app.New(), os.Args)) }
