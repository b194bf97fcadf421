// Command gpupool is the gpukit memory pool daemon and its client commands.
package main

import (
	"os"

	"gpukit/gpupool/internal/app"
)

func main() { os.Exit(app.Main(os.Args)) }
