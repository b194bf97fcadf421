package app

import (
	"fmt"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data"
	"gpukit/trainer/internal/train"
)

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:  "eval",
		Usage: "print the test accuracy (MLP) or validation loss (GPT) of a checkpoint",
		Description: "MLP: prints {\"test_accuracy\": A, \"correct\": C, \"examples\": N, \"ckpt\": FILE} on stdout and a\n" +
			"human line on stderr. A checkpoint without trainer metadata (e.g. from PyTorch) is read by the\n" +
			"shapes of fc<i>.weight, with --act between layers.\n" +
			"GPT: prints {\"val_loss\": L, \"batches\": N, ...}, the mean loss over the run's fixed validation\n" +
			"batches of --data (default: the text the run trained on).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "ckpt", Usage: "(required) safetensors file written by trainer run or init"},
			dataFlag,
			&cli.IntFlag{Name: "batch", Value: 500, Usage: "examples per forward pass"},
			&cli.StringFlag{Name: "act", Value: "relu", Usage: "relu|gelu, for checkpoints without trainer metadata"},
			&cli.IntFlag{Name: "eval-batches", Usage: "gpt: validation batches (default: the run's)"},
			&cli.StringFlag{Name: "batches-out", Usage: "gpt: also write the validation batches to this safetensors file (for bench/reference/gpt.py eval)"},
			poolFlag, deviceFlag, graphFlag, precisionFlag, traceFlag,
		},
		Action: func(c *cli.Context) error {
			if err := kit.NoArgs(c); err != nil {
				return err
			}
			if err := kit.Require(c, "ckpt"); err != nil {
				return err
			}
			prec, err := commonChecks(c)
			if err != nil {
				return err
			}
			defer setupTrace(c)()
			path := c.String("ckpt")
			if train.IsLMCheckpointFile(path) {
				return evalLM(c, path, prec)
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
			if err := kit.JSONLine(c.App.Writer, map[string]any{"test_accuracy": acc, "correct": correct, "examples": test.N, "ckpt": path}); err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "trainer: %s: test accuracy %.2f%% (%d of %d)\n", path, 100*acc, correct, test.N)
			return nil
		},
	}
}

func initCommand() *cli.Command {
	return &cli.Command{
		Name:  "init",
		Usage: "write a model's initial weights (as run would draw them) to a safetensors file",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "out", Usage: "(required) safetensors file to write; an existing one is replaced only with --force"},
			kit.ForceFlag(),
			&cli.StringFlag{Name: "model", Value: "mlp", Usage: "mlp or gpt (the gpt's vocabulary comes from --data)"},
			widthsFlag, actFlag, seedFlag, dataFlag,
			&cli.IntFlag{Name: "batch", Value: train.DefaultLM().Batch, Usage: "gpt: sequences per step (stored in the config)"},
			&cli.Float64Flag{Name: "lr", Value: kit.F32(train.DefaultLM().LR), Usage: "gpt: learning rate (stored in the config)"},
			&cli.Float64Flag{Name: "weight-decay", Value: kit.F32(train.DefaultLM().WeightDecay), Usage: "gpt: weight decay (stored in the config)"},
			&cli.Float64Flag{Name: "clip", Value: kit.F32(train.DefaultLM().Clip), Usage: "gpt: gradient clipping (stored in the config)"},
		}, lmFlags...),
		Action: func(c *cli.Context) error {
			if err := kit.NoArgs(c); err != nil {
				return err
			}
			if err := kit.Require(c, "out"); err != nil {
				return err
			}
			if c.String("model") == "gpt" {
				return initLM(c)
			}
			cfg := train.Default()
			ws, err := parseWidths(c.String("widths"))
			if err != nil {
				return err
			}
			cfg.Model, cfg.Widths, cfg.Act, cfg.Seed = c.String("model"), ws, c.String("act"), c.Uint64("seed")
			if err := cfg.Validate(); err != nil {
				return usage(err)
			}
			if err := kit.CheckOut(c, "out", c.String("out")); err != nil {
				return fmt.Errorf("init: %w", err)
			}
			if err := train.Init(allocHost(), cfg, c.String("out")); err != nil {
				return err
			}
			fmt.Fprintf(c.App.ErrWriter, "trainer: wrote initial weights of %v to %s\n", ws, c.String("out"))
			return nil
		},
	}
}
