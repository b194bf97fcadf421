// Command tracer: one timeline across all gpukit tools, as Chrome trace JSON for Perfetto
package main

import (
	"fmt"
	"os"

	"gpukit/tracer/internal/app"
)

func main() {
	if err := app.New().Run(os.Args); err != nil {
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, "tracer:", msg)
		}
		os.Exit(app.ExitCode(err))
	}
}
