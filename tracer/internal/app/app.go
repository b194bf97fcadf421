// Package app is the command-line layer of tracer: flags and subcommands only.
package app

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// New returns the tracer command.
func New() *cli.App {
	return &cli.App{
		Name:            "tracer",
		Usage:           "one timeline across all gpukit tools, as Chrome trace JSON for Perfetto",
		Description:     `tracer collects spans, counters and GPU timings from every gpukit process into one Chrome Trace Event file that opens in Perfetto or chrome://tracing, and reports where the time went.`,
		HideHelpCommand: true,
		ExitErrHandler:  func(*cli.Context, error) {},
		Commands: []*cli.Command{
			later("serve", "collect events from traced processes into a trace file", "tracer"),
			later("record", "run a command with tracing on and write the trace", "tracer"),
			later("report", "summarise a trace file", "tracer"),
		},
	}
}

// later is a subcommand that a later issue builds: it says so and exits 2.
func later(name, usage, issue string) *cli.Command {
	return &cli.Command{
		Name:            name,
		Usage:           usage + " (not built yet)",
		SkipFlagParsing: true,
		Action: func(*cli.Context) error {
			return cli.Exit(name+": not built yet; it comes with the issue \""+issue+"\"", 2)
		},
	}
}

// ExitCode maps an error from Run to the process exit status.
func ExitCode(err error) int {
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode()
	}
	return 1
}
