package app

import (
	"fmt"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"

	"gpukit/tracer/internal/chrome"
	"gpukit/tracer/internal/report"
)

var reportCommand = &cli.Command{
	Name:      "report",
	Usage:     "summarise a trace file",
	ArgsUsage: "TRACE.json",
	Description: "report prints the top names, categories and processes by total and self time, the GPU busy " +
		"fraction, and the trainer's per-step breakdown. --json prints the same as one JSON line. --check " +
		"also validates the file (fields, durations, flow pairs, process and thread names) and fails on the first problem.",
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "top", Aliases: []string{"n"}, Value: 10, Usage: "rows per table (0: all)"},
		&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
		&cli.BoolFlag{Name: "check", Usage: "validate the trace first"},
	},
	Action: runReport,
}

func runReport(c *cli.Context) error {
	if c.NArg() != 1 {
		return kit.Usagef("report: give one trace file (see tracer report --help)")
	}
	tr, err := chrome.ReadFile(c.Args().First())
	if err != nil {
		return err
	}
	var sum chrome.Summary
	if c.Bool("check") {
		if sum, err = tr.Validate(); err != nil {
			return err
		}
	}
	r := report.Build(tr, c.Int("top"))
	if c.Bool("json") {
		out := struct {
			*report.Report
			Check *chrome.Summary `json:"check,omitempty"`
		}{Report: r}
		if c.Bool("check") {
			out.Check = &sum
		}
		return kit.JSONLine(c.App.Writer, out)
	}
	if err := r.WriteText(c.App.Writer); err != nil {
		return err
	}
	if c.Bool("check") {
		fmt.Fprintf(c.App.Writer, "\ncheck: valid; %d flows (%d across processes, linking %d processes)\n",
			sum.Flows, sum.CrossFlows, sum.LinkedProcesses)
	}
	return nil
}
