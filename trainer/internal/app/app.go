package app

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"
)

// Exit statuses.
const (
	exitFail     = 1 // bad input or a failure
	exitNotBuilt = 2 // a subcommand or option a later issue builds
)

// errNotBuilt marks something accepted by the command line that is not built yet.
var errNotBuilt = errors.New("not built yet")

// New returns the trainer application. stdout carries JSON lines, stderr
// human messages.
func New(stdout, stderr io.Writer) *cli.App {
	return &cli.App{
		Name:  "trainer",
		Usage: "train and evaluate models on gpukit ops (an MLP on Fashion-MNIST today)",
		Description: "trainer runs the forward pass, backward pass and optimizer step of a model on a GPU (the\n" +
			"whole step replayed as CUDA graphs) or on the host, with parameters, gradients and optimizer state\n" +
			"allocated in-process or through a gpupool daemon (--pool). JSON lines go to stdout, human messages\n" +
			"to stderr.",
		Writer:          stdout,
		ErrWriter:       stderr,
		HideHelpCommand: true,
		HideVersion:     true,
		OnUsageError:    usageError,
		ExitErrHandler:  func(*cli.Context, error) {},
		Commands: []*cli.Command{
			runCommand(),
			evalCommand(),
			initCommand(),
			infoCommand(),
			notBuilt("bench", "time training steps against bench/reference (with the CUDA backend)"),
			notBuilt("serve", "serve a model's weights to other tools through the pool"),
		},
	}
}

// Main runs the application on args and returns the exit status: every
// error becomes one line on stderr.
func Main(args []string, stdout, stderr io.Writer) int {
	err := New(stdout, stderr).Run(args)
	if err == nil {
		return 0
	}
	msg := strings.ReplaceAll(err.Error(), "\n", " ")
	if !strings.HasPrefix(msg, "trainer") {
		msg = "trainer: " + msg
	}
	fmt.Fprintln(stderr, msg)
	if errors.Is(err, errNotBuilt) {
		return exitNotBuilt
	}
	return exitFail
}

func usageError(_ *cli.Context, err error, _ bool) error {
	return fmt.Errorf("%w (see --help)", err)
}

func notBuilt(name, what string) *cli.Command {
	return &cli.Command{
		Name:            name,
		Usage:           what + " — not built yet",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return fmt.Errorf("trainer %s: %w (a later issue adds it)", name, errNotBuilt)
		},
	}
}
