package hrm

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/data/sudoku"
	"gpukit/libgpu/nn"
)

// puzzleSet is n valid puzzles: a fixed solution under random symmetries,
// cells blank with probability ½.
func puzzleSet(t *testing.T, seed uint64, n int) *sudoku.Set {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	var base sudoku.Grid
	for i := range base {
		row, col := i/9, i%9
		base[i] = uint8((row*3+row/3+col)%9 + 1)
	}
	s := &sudoku.Set{Meta: map[string]string{"source": "test"}}
	for range n {
		sol := sudoku.RandomTransform(r).Apply(base)
		p := sol
		for i := range p {
			if r.IntN(2) == 0 {
				p[i] = 0
			}
		}
		s.Inputs, s.Labels = append(s.Inputs, p), append(s.Labels, sol)
	}
	return s
}

// runFlags parses args as trainer run --model hrm's flags.
func runFlags(t *testing.T, args ...string) Config {
	t.Helper()
	var cfg Config
	app := &cli.App{Writer: io.Discard, ErrWriter: io.Discard, Flags: append(flags(), &cli.StringFlag{Name: "data"}),
		Action: func(c *cli.Context) (err error) {
			cfg, err = configFromFlags(c)
			return err
		}}
	if err := app.Run(append([]string{"trainer"}, args...)); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestBatchesMatchReplay: the batches a run stages (its sampler,
// augmentation copies and exploration draws, from --data-seed and
// --num-aug) are those `trainer data replay` writes for the same seed,
// augmentation, batch and halting settings: the file hrm.py parity
// trains on.
func TestBatchesMatchReplay(t *testing.T) {
	dir := t.TempDir()
	set := puzzleSet(t, 3, 7)
	setPath, replay := filepath.Join(dir, TrainFile), filepath.Join(dir, "replay.safetensors")
	if err := sudoku.Save(setPath, set); err != nil {
		t.Fatal(err)
	}
	const steps, B = 4, 5
	app := &cli.App{Writer: io.Discard, ErrWriter: io.Discard, Commands: []*cli.Command{dataCommand()}}
	if err := app.Run([]string{"trainer", "data", "replay", "--set", setPath, "--out", replay, "--steps", "4", "--batch", "5",
		"--num-aug", "3", "--seed", "9", "--halt-exploration-prob", "0.4", "--halt-max-steps", "5"}); err != nil {
		t.Fatal(err)
	}
	r, err := sudoku.LoadReplay(replay)
	if err != nil {
		t.Fatal(err)
	}
	cfg := runFlags(t, "--data", dir, "--data-seed", "9", "--seed", "2", "--num-aug", "3", "--batch", "5",
		"--halt-exploration-prob", "0.4", "--halt-max-steps", "5")
	tk, _ := newTask(cfg)
	if err := tk.setData(set, set); err != nil {
		t.Fatal(err)
	}
	in, lab := make([]sudoku.Grid, B), make([]sudoku.Grid, B)
	tin, tlab := make([]uint8, B*sudoku.Cells), make([]uint8, B*sudoku.Cells)
	explored := 0
	for s := range steps {
		mh := tk.batch(tk.sampler(), s, in, lab, tin, tlab)
		lo, hi := s*B, (s+1)*B
		if !slices.Equal(tin, tokens(r.Inputs[lo:hi])) || !slices.Equal(tlab, tokens(r.Labels[lo:hi])) {
			t.Errorf("step %d: the run's batch differs from the replay's", s)
		}
		if !slices.Equal(mh, r.MinHaltSteps[lo:hi]) {
			t.Errorf("step %d: exploration draws %v, replay %v", s, mh, r.MinHaltSteps[lo:hi])
		}
		for _, m := range mh {
			if m > 0 {
				explored++
			}
		}
		if !slices.Equal(tin, nn.HRMTokens(flat(in))) {
			t.Errorf("step %d: tokens are not the digits + 1", s)
		}
	}
	if explored == 0 {
		t.Error("no exploration draw in 20 rows at probability 0.4: the case does not test them")
	}
}

func flat(gs []sudoku.Grid) []uint8 {
	var out []uint8
	for i := range gs {
		out = append(out, gs[i][:]...)
	}
	return out
}

// TestConfigIsHRMPyConfig: the run's configuration JSON (the checkpoints'
// "config" metadata) holds the architecture under hrm.py's ARCH_DEFAULTS
// keys at its top level, which nn.LoadHRM (and hrm.py) read back; the
// defaults are the reference's Sudoku run.
func TestConfigIsHRMPyConfig(t *testing.T) {
	cfg := runFlags(t, "--data", "x", "--hidden", "64", "--heads", "4", "--h-cycles", "3", "--halt-max-steps", "7")
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"hidden", "heads", "h_layers", "l_layers", "h_cycles", "l_cycles", "expansion", "halt_max_steps",
		"halt_exploration_prob", "vocab", "seq_len", "num_puzzle_ids", "rope_theta", "rms_eps"} {
		if _, ok := top[k]; !ok {
			t.Errorf("config JSON lacks %q at its top level: %s", k, b)
		}
	}
	back := nn.DefaultHRM()
	if err := json.Unmarshal(b, &back); err != nil || back != cfg.HRMConfig || back.Hidden != 64 || back.HCycles != 3 {
		t.Errorf("read back %+v (%v), want %+v", back, err, cfg.HRMConfig)
	}
	d := runFlags(t, "--data", "x", "--steps", "50000")
	if d.HRMConfig != nn.DefaultHRM() || d.Batch != 768 || d.LR != 1e-4 || d.PuzzleEmbLR != 1e-4 || d.WeightDecay != 1 ||
		d.PuzzleEmbWeightDecay != 1 || d.Beta1 != 0.9 || d.Beta2 != 0.95 || d.Warmup != 2000 || d.LRMinRatio != 1 ||
		d.NumAug != 1000 || d.HaltExplorationProb != 0.1 || d.DataSeed != d.Seed {
		t.Errorf("defaults %+v", d)
	}
	if s := runFlags(t, "--data", "x", "--steps", "300"); s.Warmup != 30 {
		t.Errorf("--steps 300: warmup %d, want a tenth", s.Warmup)
	}
}
