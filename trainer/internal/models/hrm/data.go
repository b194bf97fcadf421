package hrm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data/sudoku"
)

// dataCommand is `trainer data`: the Sudoku sets --model hrm trains on
// and the replay files of bench/reference/hrm.py parity. (A command of
// another model named data would add its subcommands beside these.)
func dataCommand() *cli.Command {
	return &cli.Command{
		Name:        "data",
		Usage:       "make datasets for the trainer's models (sudoku, replay)",
		Subcommands: []*cli.Command{dataSudokuCommand(), dataReplayCommand()},
	}
}

func dataSudokuCommand() *cli.Command {
	return &cli.Command{
		Name:  "sudoku",
		Usage: "write Sudoku training and test sets (qqwing puzzles, or a Sudoku-Extreme CSV) for the HRM",
		Description: "Writes --out/train.safetensors (--n puzzles) and --out/test.safetensors (--test-n puzzles):\n" +
			"inputs and labels U8 [N, 81] (0 blank, 1-9 digits) with metadata (libgpu/data/sudoku). Every puzzle\n" +
			"has exactly one solution (checked by a solver), and the sets share no puzzle, not even up to the\n" +
			"augmentation's symmetries (digit relabelling, band/stack and row/column shuffles, transpose).\n" +
			"Puzzles come from qqwing (Debian: apt-get install qqwing faketime) at --difficulty, run under\n" +
			"faketime with its clock frozen at seconds drawn from --seed, so the same flags give the same files;\n" +
			"or, with --from-csv, from a uniform sample of a Sudoku-Extreme CSV (source,question,answer,rating).\n" +
			"Prints one JSON line: {out, train, test, source, difficulty, seed, read, duplicates, seconds}.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Usage: "(required) directory to write train.safetensors and test.safetensors into (made if missing)"},
			&cli.IntFlag{Name: "n", Value: 1000, Usage: "training puzzles (the reference's 1k setting: 1000)"},
			&cli.IntFlag{Name: "test-n", Value: 1000, Usage: "test puzzles"},
			&cli.StringFlag{Name: "difficulty", Value: "expert", Usage: "qqwing difficulty: " + strings.Join(sudoku.Difficulties, "|")},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of qqwing's clocks, the CSV sample and the split"},
			&cli.StringFlag{Name: "from-csv", Usage: "draw the puzzles from this Sudoku-Extreme CSV file instead of qqwing"},
			&cli.IntFlag{Name: "jobs", DefaultText: "the number of CPUs", Usage: "qqwing processes at once (never changes the puzzles)"},
			kit.ForceFlag(),
		},
		Action: func(c *cli.Context) error {
			if err := kit.NoArgs(c); err != nil {
				return err
			}
			if err := kit.Require(c, "out"); err != nil {
				return err
			}
			cfg := sudoku.BuildConfig{Train: c.Int("n"), Test: c.Int("test-n"), Seed: c.Uint64("seed"),
				Difficulty: c.String("difficulty"), CSV: c.String("from-csv"), Jobs: c.Int("jobs")}
			switch {
			case cfg.Train < 0 || cfg.Test < 0 || cfg.Train+cfg.Test < 1:
				return kit.Usagef("--n %d --test-n %d: want counts ≥ 0, at least one puzzle in all", cfg.Train, cfg.Test)
			case !slices.Contains(sudoku.Difficulties, cfg.Difficulty):
				return kit.Usagef("--difficulty %q: want one of %s", cfg.Difficulty, strings.Join(sudoku.Difficulties, ", "))
			case cfg.CSV != "" && c.IsSet("difficulty"):
				return kit.Usagef("--difficulty is qqwing's; --from-csv takes the file's puzzles as they are")
			case cfg.Jobs < 0:
				return kit.Usagef("--jobs %d: want ≥ 0", cfg.Jobs)
			}
			out := c.String("out")
			if err := kit.CheckOut(c, "out", out, TrainFile, TestFile); err != nil {
				return err
			}
			if cfg.CSV == "" {
				if _, err := sudoku.Tools(); err != nil {
					return err
				}
			} else if _, err := os.Stat(cfg.CSV); err != nil {
				return fmt.Errorf("--from-csv: %w", err)
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			return writeSudoku(c, out, cfg)
		},
	}
}

func writeSudoku(c *cli.Context, out string, cfg sudoku.BuildConfig) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	total := int64(cfg.Train + cfg.Test)
	what, unit := "sudoku: qqwing", "puzzle"
	if cfg.CSV != "" {
		total, what, unit = -1, "sudoku: "+filepath.Base(cfg.CSV), "row"
	}
	bar := kit.NewProgress(c.App.ErrWriter, total, what, unit)
	cfg.Progress = func(n int) {
		if total > 0 {
			bar.Set(min(int64(n), total), "")
		} else {
			bar.Set(int64(n), "")
		}
	}
	start := time.Now()
	train, test, st, err := sudoku.Build(ctx, cfg)
	bar.Done()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return fmt.Errorf("data sudoku: interrupted; nothing written")
		}
		return err
	}
	for _, f := range []struct {
		name string
		set  *sudoku.Set
	}{{TrainFile, train}, {TestFile, test}} {
		if err := sudoku.Save(filepath.Join(out, f.name), f.set); err != nil {
			return err
		}
	}
	secs := time.Since(start).Seconds()
	line := map[string]any{"out": out, "train": train.Len(), "test": test.Len(), "source": st.Source,
		"seed": cfg.Seed, "read": st.Read, "duplicates": st.Duplicates, "seconds": secs}
	from := st.Source
	if cfg.CSV == "" {
		line["difficulty"] = cfg.Difficulty
		from += " " + cfg.Difficulty
	}
	if err := kit.JSONLine(c.App.Writer, line); err != nil {
		return err
	}
	fmt.Fprintf(c.App.ErrWriter, "trainer: wrote %d training and %d test puzzles (%s, seed %d) to %s in %.1fs\n",
		train.Len(), test.Len(), from, cfg.Seed, out, secs)
	return nil
}

func dataReplayCommand() *cli.Command {
	return &cli.Command{
		Name:  "replay",
		Usage: "write the batches of a number of HRM training steps (for parity with bench/reference/hrm.py)",
		Description: "Draws --steps batches of --batch puzzles from --set (a train.safetensors of trainer data sudoku) with\n" +
			"the seeded sampler and augmentation of libgpu/data/sudoku, and the ACT exploration draws of each step,\n" +
			"and writes them to --out as a replay file (gpukit-sudoku-replay/1: inputs, labels U8 [S, B, 81],\n" +
			"min_halt_steps, puzzle, copy I32 [S, B]), which hrm.py parity --replay trains on. Prints one JSON line.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "set", Usage: "(required) training set file (train.safetensors)"},
			&cli.StringFlag{Name: "out", Usage: "(required) replay file to write"},
			&cli.IntFlag{Name: "steps", Value: 50, Usage: "training steps (segments)"},
			&cli.IntFlag{Name: "batch", Value: 768, Usage: "puzzles per step (the reference's global batch)"},
			&cli.IntFlag{Name: "num-aug", Value: 1000, Usage: "augmented copies per puzzle (the reference's 1k setting: 1000; 0: none)"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the batches, the augmentation and the exploration draws"},
			&cli.Float64Flag{Name: "halt-exploration-prob", Value: 0.1, Usage: "ACT exploration probability"},
			&cli.IntFlag{Name: "halt-max-steps", Value: 16, Usage: "most segments per puzzle"},
			kit.ForceFlag(),
		},
		Action: func(c *cli.Context) error {
			if err := kit.NoArgs(c); err != nil {
				return err
			}
			if err := kit.Require(c, "set", "out"); err != nil {
				return err
			}
			steps, batch, aug := c.Int("steps"), c.Int("batch"), c.Int("num-aug")
			prob, maxSteps := c.Float64("halt-exploration-prob"), c.Int("halt-max-steps")
			switch {
			case steps < 1 || batch < 1 || aug < 0:
				return kit.Usagef("--steps %d --batch %d --num-aug %d: want steps and batch ≥ 1, num-aug ≥ 0", steps, batch, aug)
			case !(prob >= 0 && prob <= 1) || maxSteps < 2:
				return kit.Usagef("--halt-exploration-prob %g --halt-max-steps %d: want a probability and at least 2 steps", prob, maxSteps)
			}
			out := c.String("out")
			if err := kit.CheckOut(c, "out", out); err != nil {
				return err
			}
			set, err := sudoku.Load(c.String("set"))
			if err != nil {
				return fmt.Errorf("--set: %w", err)
			}
			seed := c.Uint64("seed")
			r, err := sudoku.NewReplay(set, sudoku.ReplayConfig{
				Sampler: sudoku.Sampler{N: set.Len(), Batch: batch, Seed: seed, Aug: sudoku.Augmenter{Seed: seed, NumAug: aug}},
				Steps:   steps, Prob: prob, MaxSteps: maxSteps})
			if err != nil {
				return err
			}
			if err := r.Save(out); err != nil {
				return err
			}
			return kit.JSONLine(c.App.Writer, map[string]any{"out": out, "steps": steps, "batch": batch, "num_aug": aug, "seed": seed, "train": set.Len()})
		},
	}
}
