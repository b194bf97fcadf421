package app

import (
	"encoding/json"
	"fmt"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/data"
	"gpukit/trainer/internal/train"
)

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:  "eval",
		Usage: "print the test accuracy of a checkpoint",
		Description: "Prints {\"test_accuracy\": A, \"correct\": C, \"examples\": N, \"ckpt\": FILE} on stdout and a\n" +
			"human line on stderr. A checkpoint without trainer metadata (e.g. from PyTorch) is read by the\n" +
			"shapes of fc<i>.weight, with --act between layers.",
		OnUsageError: usageError,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "ckpt", Usage: "(required) safetensors file written by trainer run or init"},
			dataFlag,
			&cli.IntFlag{Name: "batch", Value: 500, Usage: "examples per forward pass"},
			&cli.StringFlag{Name: "act", Value: "relu", Usage: "relu|gelu, for checkpoints without trainer metadata"},
			poolFlag, deviceFlag, graphFlag, precisionFlag, traceFlag,
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("eval: unexpected argument %q (see --help)", c.Args().First())
			}
			prec, err := commonChecks(c)
			if err != nil {
				return err
			}
			defer setupTrace(c)()
			path := c.String("ckpt")
			if path == "" {
				return fmt.Errorf("eval: --ckpt FILE is required")
			}
			f, cfg, _, err := train.ReadCheckpoint(path, c.String("act"))
			if err != nil {
				return fmt.Errorf("--ckpt: %w", err)
			}
			test, err := data.Load(c.String("data"), data.Test)
			if err != nil {
				return fmt.Errorf("%w (install the Debian package dataset-fashion-mnist or pass --data)", err)
			}
			a, closeFn, err := allocator(c)
			if err != nil {
				return err
			}
			defer closeFn()
			acc, err := train.Evaluate(a, prec, f, cfg, c.Int("batch"), test)
			if err != nil {
				return err
			}
			correct := int(acc*float64(test.N) + 0.5)
			b, _ := json.Marshal(map[string]any{"test_accuracy": acc, "correct": correct, "examples": test.N, "ckpt": path})
			fmt.Fprintln(c.App.Writer, string(b))
			fmt.Fprintf(c.App.ErrWriter, "trainer: %s: test accuracy %.2f%% (%d of %d)\n", path, 100*acc, correct, test.N)
			return nil
		},
	}
}

func initCommand() *cli.Command {
	return &cli.Command{
		Name:         "init",
		Usage:        "write a model's initial weights (as run would draw them) to a safetensors file",
		OnUsageError: usageError,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Usage: "(required) safetensors file to write"},
			&cli.StringFlag{Name: "model", Value: "mlp", Usage: "model (mlp)"},
			widthsFlag, actFlag, seedFlag,
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("init: unexpected argument %q (see --help)", c.Args().First())
			}
			if c.String("out") == "" {
				return fmt.Errorf("init: --out FILE is required")
			}
			cfg := train.Default()
			ws, err := parseWidths(c.String("widths"))
			if err != nil {
				return err
			}
			cfg.Model, cfg.Widths, cfg.Act, cfg.Seed = c.String("model"), ws, c.String("act"), c.Uint64("seed")
			if err := train.Init(allocHost(), cfg, c.String("out")); err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "trainer: wrote initial weights of %v to %s\n", ws, c.String("out"))
			return nil
		},
	}
}
