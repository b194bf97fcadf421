// Package hrm is `trainer run --model hrm`: the Hierarchical Reasoning
// Model (libgpu/nn.HRM; Wang et al. 2025, arXiv 2506.21734; sapientinc/HRM)
// trained on Sudoku sets of `trainer data sudoku` with the reference's
// deep supervision, adaptive halting (ACT) and optimizers, one segment
// per driver step; `trainer eval` and `trainer solve` of its
// checkpoints; and `trainer data sudoku|replay`, the data it trains on.
// bench/reference/hrm.py is the same model in PyTorch: its docstring is
// the contract (tensor names, data, losses) this package's checkpoints
// and batches follow.
package hrm

import (
	"fmt"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/ckpt"
	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/nn"
	"gpukit/trainer/internal/driver"
)

func init() {
	driver.Register(driver.Model{
		Name:    Name,
		Summary: "Hierarchical Reasoning Model on Sudoku",
		Data: driver.DataFlag{Usage: "DIR: (required; a resumed run reads its run's again) a directory of trainer data sudoku: " +
			"train.safetensors, and test.safetensors, which the evaluations take"},
		Lines: "A step is one segment of the batch (forward, backward and optimizer step with the carried state), as\n" +
			"in bench/reference/hrm.py. {step, loss, lr, sequences_per_s, step_ms[, mfu], lm_loss, q_halt_loss,\n" +
			"q_continue_loss, count, accuracy, exact_accuracy, q_halt_accuracy, steps, halted} every --log-every\n" +
			"steps and after the last: hrm.py's fields (losses over the batch; count = halted = the sequences that\n" +
			"halted after the step; accuracy, exact_accuracy, q_halt_accuracy and steps, the mean segments, over\n" +
			"those). {step, test_exact_accuracy, test_cell_accuracy, test_mean_segments, test_puzzles, elapsed_s}\n" +
			"every --eval-every steps and at the end: the first --eval-n test puzzles with halting (on a GPU each\n" +
			"batch one CUDA graph whose segment loop is a conditional node). best.safetensors keeps the\n" +
			"evaluation of the highest test exact accuracy (ties: cell accuracy; its val_loss metadata is\n" +
			"1 − exact + 1e-6·(1 − cell)). model.safetensors holds hrm.py's tensor names (its strict load takes\n" +
			"it); state.safetensors adds AdamATan2's state (optim/) and the carried state (carry.*).",
		Flags:     flags(),
		Resumable: []string{"steps", "eval-every", "eval-n", "save-every"},
		Defaults:  map[string]string{"precision": "bf16", "log-every": "100"},
		New: func(c *cli.Context) (driver.Task, error) {
			cfg, err := configFromFlags(c)
			if err != nil {
				return nil, err
			}
			return newTask(cfg)
		},
		Resume: func(c *cli.Context, s driver.Stored) (driver.Task, error) {
			cfg, err := storedConfig(s.Config)
			if err != nil {
				return nil, err
			}
			for _, f := range []struct {
				name string
				dst  *int
			}{{"steps", &cfg.Steps}, {"eval-every", &cfg.EvalEvery}, {"eval-n", &cfg.EvalN}, {"save-every", &cfg.SaveEvery}} {
				if c.IsSet(f.name) {
					*f.dst = c.Int(f.name)
				}
			}
			if c.IsSet("data") {
				if cfg.Data, err = absData(c.String("data")); err != nil {
					return nil, err
				}
			}
			if err := cfg.Validate(); err != nil {
				return nil, err
			}
			return newTask(cfg)
		},
		Eval:     evalCommand(),
		Commands: []*cli.Command{solveCommand(), dataCommand()},
		// hrm.py's weights files (init, parity --out, train --out): no
		// trainer metadata, its format and tensor names.
		Foreign: func(h *ckpt.Header) bool {
			_, ok := h.Tensors["inner.q_head.weight"]
			return ok && h.Metadata["format"] == nn.HRMFormat
		},
	})
}

func flags() []cli.Flag {
	d := Default()
	return []cli.Flag{
		&cli.IntFlag{Name: "steps", Value: d.Steps, Usage: "segment steps (with --resume: the new total); the default is the reference's 20000 epochs of 1000 puzzles at batch 768"},
		&cli.IntFlag{Name: "batch", Value: d.Batch, Usage: "sequences per segment step"},
		&cli.Float64Flag{Name: "lr", Value: kit.F32(d.LR), Usage: "AdamATan2's learning rate after the warmup"},
		&cli.Float64Flag{Name: "puzzle-emb-lr", Value: kit.F32(d.PuzzleEmbLR), Usage: "sign-SGD's learning rate of the puzzle embedding"},
		&cli.Float64Flag{Name: "weight-decay", Value: kit.F32(d.WeightDecay), Usage: "AdamATan2's decoupled weight decay"},
		&cli.Float64Flag{Name: "puzzle-emb-weight-decay", Value: kit.F32(d.PuzzleEmbWeightDecay), Usage: "sign-SGD's decoupled weight decay"},
		&cli.Float64Flag{Name: "beta1", Value: kit.F32(d.Beta1), Usage: "AdamATan2 β1"},
		&cli.Float64Flag{Name: "beta2", Value: kit.F32(d.Beta2), Usage: "AdamATan2 β2"},
		&cli.IntFlag{Name: "warmup", Value: d.Warmup, DefaultText: "2000, or a tenth of --steps when that is less", Usage: "linear warmup steps"},
		&cli.Float64Flag{Name: "lr-min-ratio", Value: d.LRMinRatio, Usage: "cosine decay after the warmup to this fraction of the rates (1: constant)"},
		&cli.Uint64Flag{Name: "seed", Value: d.Seed, Usage: "seed of the initial weights"},
		&cli.Uint64Flag{Name: "data-seed", DefaultText: "--seed", Usage: "seed of the batches, the augmentation and the exploration draws (trainer data replay --seed)"},
		&cli.IntFlag{Name: "num-aug", Value: d.NumAug, Usage: "augmented copies of each training puzzle besides itself (digit relabelling, band/stack and row/column shuffles, transpose; 0: none)"},
		&cli.IntFlag{Name: "limit", Usage: "train on the first N training puzzles only (0: all)"},
		&cli.IntFlag{Name: "eval-every", Value: d.EvalEvery, Usage: "segment steps between evaluations (and checkpoints)"},
		&cli.IntFlag{Name: "eval-n", Usage: "test puzzles each evaluation takes, the first ones (0: all)"},
		&cli.IntFlag{Name: "save-every", Value: d.SaveEvery, Usage: "segment steps between checkpoints besides the evaluations'"},
		&cli.IntFlag{Name: "hidden", Value: d.Hidden, Usage: "model width"},
		&cli.IntFlag{Name: "heads", Value: d.Heads, Usage: "attention heads (hidden/heads even, at most 128)"},
		&cli.IntFlag{Name: "h-layers", Value: d.HLayers, Usage: "blocks of the H (slow) module"},
		&cli.IntFlag{Name: "l-layers", Value: d.LLayers, Usage: "blocks of the L (fast) module"},
		&cli.IntFlag{Name: "h-cycles", Value: d.HCycles, Usage: "H updates per segment"},
		&cli.IntFlag{Name: "l-cycles", Value: d.LCycles, Usage: "L updates per H update"},
		&cli.Float64Flag{Name: "expansion", Value: d.Expansion, Usage: "SwiGLU expansion"},
		&cli.IntFlag{Name: "halt-max-steps", Value: d.HaltMaxSteps, Usage: "segments per puzzle at most (ACT)"},
		&cli.Float64Flag{Name: "halt-exploration-prob", Value: d.HaltExplorationProb, Usage: "probability of ACT's exploration draw of a minimum segment count"},
	}
}

// configFromFlags is a fresh run's configuration.
func configFromFlags(c *cli.Context) (Config, error) {
	cfg := Default()
	a := &cfg.HRMConfig
	a.Hidden, a.Heads, a.HLayers, a.LLayers = c.Int("hidden"), c.Int("heads"), c.Int("h-layers"), c.Int("l-layers")
	a.HCycles, a.LCycles, a.Expansion = c.Int("h-cycles"), c.Int("l-cycles"), c.Float64("expansion")
	a.HaltMaxSteps, a.HaltExplorationProb = c.Int("halt-max-steps"), c.Float64("halt-exploration-prob")
	cfg.Steps, cfg.Batch, cfg.Warmup, cfg.LRMinRatio = c.Int("steps"), c.Int("batch"), c.Int("warmup"), c.Float64("lr-min-ratio")
	cfg.LR, cfg.PuzzleEmbLR = float32(c.Float64("lr")), float32(c.Float64("puzzle-emb-lr"))
	cfg.WeightDecay, cfg.PuzzleEmbWeightDecay = float32(c.Float64("weight-decay")), float32(c.Float64("puzzle-emb-weight-decay"))
	cfg.Beta1, cfg.Beta2 = float32(c.Float64("beta1")), float32(c.Float64("beta2"))
	cfg.Seed, cfg.DataSeed = c.Uint64("seed"), c.Uint64("seed")
	if c.IsSet("data-seed") {
		cfg.DataSeed = c.Uint64("data-seed")
	}
	cfg.NumAug, cfg.Limit = c.Int("num-aug"), c.Int("limit")
	cfg.EvalEvery, cfg.EvalN, cfg.SaveEvery = c.Int("eval-every"), c.Int("eval-n"), c.Int("save-every")
	if !c.IsSet("warmup") {
		cfg.Warmup = min(cfg.Warmup, cfg.Steps/10)
	}
	if c.String("data") == "" {
		return cfg, kit.Usagef("--data DIR is required: a directory of trainer data sudoku --out DIR")
	}
	var err error
	if cfg.Data, err = absData(c.String("data")); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// absData is --data as an absolute path (stored for --resume).
func absData(p string) (string, error) {
	a, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("--data %s: %w", p, err)
	}
	return a, nil
}
