// Command optimizer: optimizer service: AdamW, SGD and Shampoo applied in place to shared buffers
package main

import (
	"fmt"
	"os"

	"gpukit/optimizer/internal/app"
)

func main() {
	if err := app.New().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "optimizer:", err)
		os.Exit(app.ExitCode(err))
	}
}
