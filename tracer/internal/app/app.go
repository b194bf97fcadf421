package app

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
)

// New returns the tracer command.
func New() *cli.App {
	return &cli.App{
		Name:            "tracer",
		Usage:           "one timeline across all gpukit tools, as Chrome trace JSON for Perfetto",
		Description:     `tracer collects spans, counters and GPU timings from every gpukit process into one Chrome Trace Event file that opens in Perfetto or chrome://tracing, and reports where the time went. Tools trace when given --trace SOCK or GPUKIT_TRACE=SOCK.`,
		HideHelpCommand: true,
		ExitErrHandler:  func(*cli.Context, error) {},
		Commands:        []*cli.Command{serveCommand, recordCommand, reportCommand},
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

var maxSizeFlag = &cli.StringFlag{Name: "max-size", Value: "1G",
	Usage: "stop adding events once the file would pass this size (bytes, or with K, M, G suffix; 0: no cap)"}

var outFlag = &cli.StringFlag{Name: "out", Aliases: []string{"o"}, Required: true, Usage: "trace file to write (Chrome Trace Event JSON)"}

// parseSize reads "1234", "64K", "512M", "1G" (powers of 1024).
func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	mul := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mul = 1 << 10
		case 'M':
			mul = 1 << 20
		case 'G':
			mul = 1 << 30
		}
		if mul != 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mul {
		return 0, fmt.Errorf("--max-size %q: want bytes, or a number with K, M or G", s)
	}
	return n * mul, nil
}
