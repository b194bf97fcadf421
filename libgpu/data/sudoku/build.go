package sudoku

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"

	"gpukit/libgpu/data"
)

// BuildConfig configures Build.
type BuildConfig struct {
	Train, Test int    // puzzles in each set (Train + Test ≥ 1)
	Seed        uint64 // qqwing's clocks, the CSV sample and the split
	Difficulty  string // qqwing's --difficulty (one of Difficulties); unused with CSV
	// CSV, when set, is a Sudoku-Extreme CSV file to draw the puzzles from
	// instead of qqwing.
	CSV  string
	Jobs int // qqwing processes at once (GenConfig.Jobs)
	// Progress, when set, is called with the puzzles made or read so far.
	Progress func(n int)
}

// BuildStats says what Build did.
type BuildStats struct {
	Source     string // "qqwing 1.3.4" or "csv:PATH"
	Read       int    // puzzles qqwing printed or the CSV held
	Duplicates int    // puzzles dropped as copies (Fingerprint) of one kept
}

// Build makes a training and a test set that share no puzzle up to a
// Transform. Their Train + Test puzzles are distinct by Fingerprint and
// each has exactly one solution (Solve); they come from qqwing (Generate)
// or from a uniform sample of a Sudoku-Extreme CSV file (SampleCSV), are
// put in an order drawn from the seed (data.Order(Train+Test, Seed, 0)),
// and the first Test of that order form the test set, the rest the
// training set. Each set's Meta records source, difficulty (qqwing),
// seed, split and the deduplication rule.
func Build(ctx context.Context, cfg BuildConfig) (train, test *Set, st BuildStats, err error) {
	total := cfg.Train + cfg.Test
	if cfg.Train < 0 || cfg.Test < 0 || total < 1 {
		return nil, nil, st, fmt.Errorf("sudoku: Build: %d training and %d test puzzles", cfg.Train, cfg.Test)
	}
	var pool []Puzzle
	meta := map[string]string{
		"seed":   strconv.FormatUint(cfg.Seed, 10),
		"dedupe": "one puzzle per Fingerprint (colour refinement of the grid's incidence graph: invariant under digit relabelling, band/stack and row/column-within shuffles, transpose)",
		"tokens": "inputs: 0 blank, 1-9 given; labels: 1-9",
	}
	if cfg.CSV != "" {
		f, err := os.Open(cfg.CSV)
		if err != nil {
			return nil, nil, st, fmt.Errorf("sudoku: %w", err)
		}
		defer f.Close()
		var cs CSVStats
		pool, cs, err = SampleCSV(f, total, cfg.Seed, cfg.Progress)
		if err != nil {
			return nil, nil, st, fmt.Errorf("%s: %w", cfg.CSV, err)
		}
		st = BuildStats{Source: "csv:" + cfg.CSV, Read: cs.Rows, Duplicates: cs.Duplicates}
	} else {
		var gs GenStats
		pool, gs, err = Generate(ctx, GenConfig{Count: total, Difficulty: cfg.Difficulty, Seed: cfg.Seed, Jobs: cfg.Jobs, Progress: cfg.Progress})
		if err != nil {
			return nil, nil, st, err
		}
		st = BuildStats{Source: gs.Version, Read: gs.Printed, Duplicates: gs.Duplicates}
		meta["difficulty"] = cfg.Difficulty
		meta["generator"] = "qqwing --generate N --difficulty D --symmetry none under faketime, shard k of 64 puzzles frozen at ShardClock(seed, k)"
	}
	meta["source"] = st.Source
	order := data.Order(total, cfg.Seed, 0)
	part := func(idx []int, split string) *Set {
		s := &Set{Meta: map[string]string{"split": split}}
		for k, v := range meta {
			s.Meta[k] = v
		}
		for _, i := range idx {
			s.Inputs = append(s.Inputs, pool[i].Input)
			s.Labels = append(s.Labels, pool[i].Label)
		}
		return s
	}
	return part(order[cfg.Test:], "train"), part(order[:cfg.Test], "test"), st, nil
}

// CSVStats says what SampleCSV read.
type CSVStats struct {
	Rows       int // data rows in the file
	Duplicates int // rows of the reservoir sample that copy (Fingerprint) an earlier one in its shuffled order
}

// SampleCSV draws k puzzles with distinct Fingerprints, uniformly at
// random, from a Sudoku-Extreme CSV stream (ReadCSV checks every row): a
// reservoir sample (Vitter's algorithm R, PCG seeded by seed) of
// k + k/8 + 16 rows, shuffled, deduplicated in that order and cut to k. Each
// kept puzzle must have exactly one solution (Solve). Fewer than k distinct
// puzzles in the sample is an error. progress, when set, gets the rows read.
func SampleCSV(r io.Reader, k int, seed uint64, progress func(int)) ([]Puzzle, CSVStats, error) {
	var st CSVStats
	size := k + k/8 + 16
	res := make([]Puzzle, 0, size)
	lines := make([]int, 0, size)
	rng := rand.New(rand.NewPCG(seed, 0x5ad0c5a))
	err := ReadCSV(r, func(line int, row CSVRow) error {
		st.Rows++
		if progress != nil && st.Rows%4096 == 0 {
			progress(st.Rows)
		}
		p := Puzzle{Input: row.Input, Label: row.Label}
		if len(res) < size {
			res = append(res, p)
			lines = append(lines, line)
		} else if j := rng.IntN(st.Rows); j < size {
			res[j], lines[j] = p, line
		}
		return nil
	})
	if err != nil {
		return nil, st, err
	}
	if progress != nil {
		progress(st.Rows)
	}
	// The reservoir holds the first rows in file order when the file is
	// short: shuffle, so that the first k distinct are a uniform draw.
	rng.Shuffle(len(res), func(i, j int) {
		res[i], res[j] = res[j], res[i]
		lines[i], lines[j] = lines[j], lines[i]
	})
	seen := make(map[uint64]bool, k)
	out := make([]Puzzle, 0, k)
	for i, p := range res {
		f := Fingerprint(p.Input, p.Label)
		if seen[f] {
			st.Duplicates++ // counted over the whole sample, kept or not
			continue
		}
		seen[f] = true
		if len(out) == k {
			continue
		}
		if sol, ok := Unique(p.Input); !ok || sol != p.Label {
			return nil, st, fmt.Errorf("%w: line %d: the question has not exactly one solution, or not the answer given", ErrInvalid, lines[i])
		}
		out = append(out, p)
	}
	if len(out) < k {
		return nil, st, fmt.Errorf("sudoku: %d rows (%d distinct in the sample) for the %d puzzles asked", st.Rows, len(out), k)
	}
	return out, st, nil
}
