package app

import (
	"fmt"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
)

// New returns the tracer command; run it with kit.Main (gpukit/libgpu/cli),
// which owns exit statuses and error lines.
func New() *cli.App {
	return &cli.App{
		Name:        "tracer",
		Usage:       "one timeline across all gpukit tools, as Chrome trace JSON for Perfetto",
		Description: `tracer collects spans, counters and GPU timings from every gpukit process into one Chrome Trace Event file that opens in Perfetto or chrome://tracing, and reports where the time went. Tools trace when given --trace SOCK or GPUKIT_TRACE=SOCK.`,
		Commands:    []*cli.Command{serveCommand, recordCommand, reportCommand},
	}
}

var maxSizeFlag = kit.SizeFlag("max-size", "1GiB", "stop adding events once the file would pass this size (0: no cap)")

var outFlag = &cli.StringFlag{Name: "out", Aliases: []string{"o"}, Usage: "(required) trace file to write (Chrome Trace Event JSON); an existing one is replaced only with --force"}

// parseSize reads --max-size (kit.ParseSize's syntax).
func parseSize(s string) (int64, error) {
	n, err := kit.ParseSize(s)
	if err != nil {
		return 0, kit.Usagef("--max-size: %v", err)
	}
	return n, nil
}

// checkOut validates --out before anything else happens: given, and not an
// existing file unless --force.
func checkOut(c *cli.Context) error {
	if err := kit.Require(c, "out"); err != nil {
		return err
	}
	if _, err := parseSize(c.String("max-size")); err != nil {
		return err
	}
	if err := kit.CheckOut(c, "out", c.String("out")); err != nil {
		return fmt.Errorf("%s: %w", c.Command.Name, err)
	}
	return nil
}
