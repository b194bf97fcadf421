package app

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/trainer/internal/driver"
)

// modelCommand is `trainer eval` or `trainer generate` (name) for the
// checkpoints of model m: the driver's flags (--ckpt, --data, the
// device's) and the model's command mc (nil: the model has none).
func modelCommand(name, usage string, m driver.Model, mc *driver.Command, graphWhat string) *cli.Command {
	data := m.Data
	desc := fmt.Sprintf("--ckpt names a checkpoint file, or a run directory: its best.safetensors (the lowest\n"+
		"validation loss) when it has one, else its model.safetensors; the file read is named on stderr.\n"+
		"For a --model %s checkpoint:", m.Name)
	flags := []cli.Flag{&cli.StringFlag{Name: "ckpt", Usage: "FILE|DIR: (required) a checkpoint of trainer run or init, or a run directory"}}
	if mc != nil {
		desc += " " + mc.Usage + ".\n" + mc.Description
		if mc.Data != nil {
			data = *mc.Data
		}
		flags = append(flags, mc.Flags...)
	} else {
		desc += " none (" + name + " is built for " + commandModels(name) + ")."
	}
	flags = append(append(flags, dataFlag(data)), driver.DeviceFlags(graphWhat)...)
	return &cli.Command{
		Name:        name,
		Usage:       usage,
		Description: desc + "\n" + otherCheckpoints(name),
		Flags:       flags,
		Action: func(c *cli.Context) error {
			if err := kit.NoArgs(c); err != nil {
				return err
			}
			if err := kit.Require(c, "ckpt"); err != nil {
				return err
			}
			in, err := driver.NewInput(c, "")
			if err != nil {
				return err
			}
			file, which, err := driver.Resolve(c.String("ckpt"))
			if err != nil {
				return fmt.Errorf("--ckpt: %w", err)
			}
			if mc == nil {
				return kit.Usagef("%s: %s is a --model %s checkpoint; %s is built for %s", name, file, m.Name, name, commandModels(name))
			}
			if which != "" {
				fmt.Fprintf(c.App.ErrWriter, "trainer: %s reads %s, %s\n", name, file, which)
			}
			defer kit.StartTrace(c)()
			in.Ckpt = file
			return mc.Action(c, in)
		},
	}
}

// commandModels are the models that have command name (eval, generate).
func commandModels(name string) string {
	var out []string
	for _, m := range driver.Models() {
		if (name == "eval" && m.Eval != nil) || (name == "generate" && m.Generate != nil) {
			out = append(out, "--model "+m.Name)
		}
	}
	return strings.Join(out, ", ")
}

// otherCheckpoints says that the flags depend on the checkpoint.
func otherCheckpoints(name string) string {
	return "The flags are those of the checkpoint's model: trainer " + name + " --ckpt FILE --help lists them."
}

func evalCommand(sel selection) *cli.Command {
	return modelCommand("eval", "evaluate a checkpoint: the MLP's test accuracy, a language model's validation loss, the HRM's Sudoku accuracy",
		sel.model, sel.model.Eval, "the evaluation's forward passes")
}

func generateCommand(sel selection) *cli.Command {
	return modelCommand("generate", "sample text from a language model's checkpoint, streamed to stdout",
		sel.model, sel.model.Generate, "the decode step")
}

// initCommand is `trainer init --model NAME`: the initial weights a run
// of the same flags draws.
func initCommand(sel selection) *cli.Command {
	m := sel.model
	cmd := &cli.Command{
		Name:  "init",
		Usage: "write a model's initial weights (as run would draw them) to a safetensors file",
		Description: "Takes --model and that model's flags of trainer run (their configuration is stored in the file)\n" +
			"and writes the weights a run with the same flags starts from, in model.safetensors's format:\n" +
			"what a reference implementation (bench/reference/*.py) loads to start from the same point.\n" +
			otherModels(m.Name, "init"),
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "out", Usage: "FILE: (required) safetensors file to write; an existing one is replaced only with --force"},
			kit.ForceFlag(),
			&cli.StringFlag{Name: "model", Value: m.Name, Usage: modelUsage()},
			dataFlag(m.Data),
		}, m.Flags...),
		Action: func(c *cli.Context) error {
			if err := kit.NoArgs(c); err != nil {
				return err
			}
			if err := kit.Require(c, "out"); err != nil {
				return err
			}
			task, err := m.New(c)
			if err != nil {
				return usage(err)
			}
			out := c.String("out")
			if err := kit.CheckOut(c, "out", out); err != nil {
				return fmt.Errorf("init: %w", err)
			}
			ck, err := task.Init(allocHost())
			if err != nil {
				return usage(err)
			}
			if err := driver.WriteInit(out, m.Name, task.Config(), ck); err != nil {
				return err
			}
			n := 0
			for _, e := range ck.Model {
				n += len(e.Data) / max(e.DType.Size(), 1)
			}
			fmt.Fprintf(c.App.ErrWriter, "trainer: wrote the initial weights of a --model %s (%d tensors, %.2fM numbers) to %s\n",
				m.Name, len(ck.Model), float64(n)/1e6, filepath.Clean(out))
			return nil
		},
	}
	if sel.unknown != "" {
		cmd.SkipFlagParsing = true
		cmd.Action = func(*cli.Context) error { return unknownModel(sel.unknown) }
	}
	return cmd
}
