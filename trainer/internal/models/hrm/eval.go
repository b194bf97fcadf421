package hrm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/ckpt"
	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/data/sudoku"
	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

// readCheckpoint reads an HRM weights file (model.safetensors or
// best.safetensors of a run, trainer init's, hrm.py's) and its
// architecture, before any device work.
func readCheckpoint(path string) (*ckpt.File, nn.HRMConfig, error) {
	cfg := nn.DefaultHRM()
	f, err := ckpt.ReadFile(path)
	if err != nil {
		return nil, cfg, fmt.Errorf("--ckpt: %w", err)
	}
	if m := f.Metadata[driver.MetaModel]; m != "" && m != Name {
		return nil, cfg, kit.Usagef("--ckpt %s is a --model %s checkpoint, not an HRM's", path, m)
	}
	if f.Metadata[driver.MetaFormat] == driver.FormatState {
		return nil, cfg, kit.Usagef("--ckpt %s is a run's state file: give the run directory or its model.safetensors", path)
	}
	js, ok := f.Metadata["config"]
	if !ok {
		return nil, cfg, fmt.Errorf("--ckpt %s: %w: no \"config\" metadata (not an HRM weights file)", path, driver.ErrCheckpoint)
	}
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		return nil, cfg, fmt.Errorf("--ckpt %s: %w: config: %v", path, driver.ErrCheckpoint, err)
	}
	if err := (Config{HRMConfig: cfg, Steps: 1, Batch: 1, LR: 1, Beta1: 0, Beta2: 0, LRMinRatio: 1, EvalEvery: 1,
		SaveEvery: 1}).Validate(); err != nil {
		return nil, cfg, fmt.Errorf("--ckpt %s: %w: %v", path, driver.ErrCheckpoint, err)
	}
	return f, cfg, nil
}

// loaded is a checkpoint's HRM on a device with an evaluation at a static
// batch.
type loaded struct {
	e       *ops.Engine
	m       *nn.HRM
	ev      *nn.HRMEval
	dev     device.Device
	closeFn func()
}

// open builds the model of f on the device of in, with an evaluation at
// batch (activations in bf16 with --precision bf16 on a GPU, else f32).
func open(in *driver.Input, f *ckpt.File, batch int) (l *loaded, err error) {
	a, closeFn, err := in.Alloc()
	if err != nil {
		return nil, err
	}
	l = &loaded{closeFn: closeFn, dev: a.Device()}
	defer func() {
		if err != nil {
			l.free()
			l = nil
		}
	}()
	if l.e, err = ops.NewEngine(a.Device(), ops.Options{Precision: in.Precision}); err != nil {
		return l, err
	}
	if l.m, err = nn.LoadHRM(a, "hrm", f, false); err != nil {
		return l, fmt.Errorf("--ckpt %s: %w", in.Ckpt, err)
	}
	dt := tensor.F32
	if in.Precision == ops.PrecBF16 && l.e.IsGraphCapable() {
		dt = tensor.BF16
	}
	if l.ev, err = l.m.NewEval(l.e, a, "hrm/eval", batch, dt); err != nil {
		return l, err
	}
	return l, nil
}

func (l *loaded) free() {
	if l.ev != nil {
		l.ev.Free()
	}
	if l.m != nil {
		l.m.Free()
	}
	if l.e != nil {
		driver.CloseEngine(l.e)
	}
	l.closeFn()
}

// warm evaluates the first batch of puzzles twice when the evaluation
// will replay captured graphs on a GPU: eagerly (kernels compile, GEMM
// algorithms are chosen), then captured and launched, so a timed
// evaluation after it is replays only.
func (l *loaded) warm(inputs []uint8, o nn.HRMEvalOptions) error {
	if !o.Graph || !l.e.IsGraphCapable() {
		return nil
	}
	n := min(len(inputs)/sudoku.Cells, l.ev.Batch())
	for range 2 {
		if _, err := l.ev.Evaluate(inputs[:n*sudoku.Cells], nil, o); err != nil {
			return err
		}
	}
	return nil
}

// testSet reads --data: a set file, or a directory's test.safetensors.
func testSet(path string) (string, *sudoku.Set, error) {
	if path == "" {
		return "", nil, kit.Usagef("--data is required: a directory of trainer data sudoku (its %s) or a set file", TestFile)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, TestFile)
	}
	s, err := sudoku.Load(path)
	if err != nil {
		return path, nil, fmt.Errorf("--data: %w", err)
	}
	if s.Len() == 0 {
		return path, nil, fmt.Errorf("--data %s holds no puzzle", path)
	}
	return path, s, nil
}

// evalCommand is `trainer eval` of an HRM checkpoint.
func evalCommand() *driver.Command {
	return &driver.Command{
		Usage: "exact-puzzle accuracy, cell accuracy and mean segments on the test puzzles",
		Description: "Evaluates the first --n puzzles of --data (0: all) in batches of --batch as bench/reference/hrm.py eval\n" +
			"does: each puzzle runs segments from the initial state until q_halt > q_continue or --halt-max-steps\n" +
			"(halting, the default), or always --halt-max-steps segments (--no-halt), and keeps that segment's\n" +
			"answer. On a GPU with --graph on each batch is one launch of a captured CUDA graph whose segment\n" +
			"loop is a conditional WHILE node: the halting is decided on the device, with no host round trip per\n" +
			"segment (two warm-up batches, eager then captured, run first and are not timed). Prints\n" +
			"{exact_accuracy, cell_accuracy, mean_segments, puzzles, halting, seconds, puzzles_per_s, ckpt, data}\n" +
			"on stdout and a human line on stderr. Reads hrm.py's weights files too.",
		Data: &driver.DataFlag{Usage: "DIR|FILE: (required) a directory of trainer data sudoku (its test.safetensors) or a set file"},
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "batch", Value: 768, Usage: "puzzles per batch (the last one padded)"},
			&cli.IntFlag{Name: "n", Usage: "the first N puzzles of the set (0: all)"},
			&cli.BoolFlag{Name: "no-halt", Usage: "run every puzzle --halt-max-steps segments (the model's maximum) instead of halting"},
		},
		Action: func(c *cli.Context, in *driver.Input) error {
			batch, n := c.Int("batch"), c.Int("n")
			if batch < 1 || batch > 1<<16 {
				return kit.Usagef("--batch %d: want 1 to 65536", batch)
			}
			if n < 0 {
				return kit.Usagef("--n %d: want ≥ 0 (0: every puzzle)", n)
			}
			f, cfg, err := readCheckpoint(in.Ckpt)
			if err != nil {
				return err
			}
			path, set, err := testSet(c.String("data"))
			if err != nil {
				return err
			}
			if n > 0 && n < set.Len() {
				set = &sudoku.Set{Inputs: set.Inputs[:n], Labels: set.Labels[:n]}
			}
			l, err := open(in, f, min(batch, set.Len()))
			if err != nil {
				return err
			}
			defer l.free()
			inputs, labels := tokens(set.Inputs), tokens(set.Labels)
			o := nn.HRMEvalOptions{Halting: !c.Bool("no-halt"), Graph: in.Graph}
			if err := l.warm(inputs, o); err != nil {
				return err
			}
			start := time.Now()
			res, err := l.ev.Evaluate(inputs, labels, o)
			if err != nil {
				return err
			}
			secs := time.Since(start).Seconds()
			if err := kit.JSONLine(c.App.Writer, map[string]any{"exact_accuracy": res.ExactAccuracy, "cell_accuracy": res.CellAccuracy,
				"mean_segments": res.MeanSegments, "puzzles": res.Puzzles, "halting": o.Halting, "seconds": secs,
				"puzzles_per_s": driver.Round(float64(res.Puzzles)/secs, 1), "ckpt": in.Ckpt, "data": path}); err != nil {
				return err
			}
			how := fmt.Sprintf("halting (at most %d segments)", cfg.HaltMaxSteps)
			if !o.Halting {
				how = fmt.Sprintf("always %d segments", cfg.HaltMaxSteps)
			}
			fmt.Fprintf(c.App.ErrWriter, "trainer: %s: %d puzzles, %s: exact accuracy %.2f%%, cell accuracy %.2f%%, mean segments %.2f, %.2fs on %v\n",
				in.Ckpt, res.Puzzles, how, 100*res.ExactAccuracy, 100*res.CellAccuracy, res.MeanSegments, secs, l.dev)
			return nil
		},
	}
}
