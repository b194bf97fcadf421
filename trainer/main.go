// Command trainer trains and evaluates models on gpukit's ops (see TOOLS.md).
package main

import (
	"os"

	"gpukit/trainer/internal/app"
)

func main() { os.Exit(app.Main(os.Args, os.Stdout, os.Stderr)) }
