package app

import (
	"errors"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/trainer/internal/train"
)

// New returns the trainer application. stdout carries JSON lines, stderr
// human messages. Run it with Main (libgpu/cli owns exit statuses and
// error lines).
func New(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:  "trainer",
		Usage: "train, evaluate and sample models on gpukit ops (an MLP on Fashion-MNIST, a GPT on any text)",
		Description: "trainer runs the forward pass, backward pass and optimizer step of a model on a GPU (the\n" +
			"whole step replayed as CUDA graphs) or on the host, with parameters, gradients and optimizer state\n" +
			"allocated in-process or through a gpupool daemon (--pool). JSON lines go to stdout, human messages\n" +
			"to stderr.",
		Writer:    stdout,
		ErrWriter: stderr,
		Commands: []*cli.Command{
			runCommand(),
			evalCommand(),
			initCommand(),
			generateCommand(),
			infoCommand(),
			launchCommand(),
			dataCommand(), // HRM's Sudoku data; moves under the HRM model's registration with the run driver
			kit.NotBuilt("bench", "time training steps against bench/reference (with the CUDA backend)", ""),
			kit.NotBuilt("serve", "serve a model's weights to other tools through the pool", ""),
		},
	}
}

// Main runs the application on args and returns the exit status (0, 1, or
// 2 for bad usage and commands not built yet): every error becomes one line
// on stderr.
func Main(args []string, stdout, stderr io.Writer) int {
	return kit.Main(New(stdout, stderr), args)
}

// usage makes err a usage error (exit 2) when it is a bad flag value
// (train.ErrConfig: a configuration the flags made).
func usage(err error) error {
	if err != nil && errors.Is(err, train.ErrConfig) && !errors.Is(err, kit.ErrUsage) {
		return fmt.Errorf("%w: %w", kit.ErrUsage, err)
	}
	return err
}
