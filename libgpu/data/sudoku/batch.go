package sudoku

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/tensor"
)

// Sampler draws the training batches of a run from a logged seed, as the
// reference's PuzzleDataset (puzzle_dataset.py, _iter_train) does with its
// groups: the training puzzles are visited in a sequence of epochs, each a
// fresh permutation, cut into consecutive batches of Batch puzzles (a batch
// may straddle two epochs, or several when Batch > N); each visit takes one
// copy of the puzzle's augmentation family, drawn uniformly. Row j of step t
// is visit p = t·Batch + j: puzzle data.Order(N, Seed, p/N)[p mod N], copy
// rand.New(rand.NewPCG(data.EpochSeed(Seed, t), 1)).IntN(Aug.NumAug+1), the
// step's generator drawing for rows 0, 1, ... in order. Any step's batch is
// recomputed from (Seed, t) alone, so a resumed run draws what the
// uninterrupted one would have.
type Sampler struct {
	N     int    // training puzzles
	Batch int    // puzzles per step
	Seed  uint64 // the run's data seed (log it)
	Aug   Augmenter
}

// Draw returns the training-set index and augmentation copy of each row of
// step t's batch.
func (s Sampler) Draw(t int) (puzzles, copies []int) {
	puzzles = make([]int, s.Batch)
	copies = make([]int, s.Batch)
	rng := rand.New(rand.NewPCG(data.EpochSeed(s.Seed, t), 1))
	epoch, order := -1, []int(nil)
	for j := range puzzles {
		p := t*s.Batch + j
		if e := p / s.N; e != epoch {
			epoch, order = e, data.Order(s.N, s.Seed, e)
		}
		puzzles[j] = order[p%s.N]
		copies[j] = rng.IntN(s.Aug.NumAug + 1)
	}
	return puzzles, copies
}

// Fill writes step t's batch into inputs and labels (Batch grids each):
// row j is copy copies[j] of training puzzle puzzles[j] (Draw), its
// Transform applied to the puzzle and to its solution.
func (s Sampler) Fill(set *Set, t int, inputs, labels []Grid) (puzzles, copies []int) {
	puzzles, copies = s.Draw(t)
	for j, i := range puzzles {
		tr := s.Aug.Transform(i, copies[j])
		inputs[j] = tr.Apply(set.Inputs[i])
		labels[j] = tr.Apply(set.Labels[i])
	}
	return puzzles, copies
}

// MinHaltSteps is the ACT exploration draw of step t for a batch
// (hrm_act_v1.py: min_halt_steps = (rand < halt_exploration_prob) ·
// randint(2, halt_max_steps + 1)): row j draws u uniform in [0, 1) and m
// uniform in [2, maxSteps], in that order, from
// rand.New(rand.NewPCG(data.EpochSeed(seed, t), 2)), and gets m when
// u < prob, else 0. A sequence may halt at step t only once its segment
// count reaches the row's value. maxSteps must be at least 2.
func MinHaltSteps(seed uint64, t, batch int, prob float64, maxSteps int) []int32 {
	rng := rand.New(rand.NewPCG(data.EpochSeed(seed, t), 2))
	out := make([]int32, batch)
	for j := range out {
		u := rng.Float64()
		m := 2 + rng.IntN(maxSteps-1)
		if u < prob {
			out[j] = int32(m)
		}
	}
	return out
}

// ReplayFormat is the value of the "format" metadata key of a replay file.
const ReplayFormat = "gpukit-sudoku-replay/1"

// Replay is every batch of a fixed number of training steps, written once
// so that two implementations (the Go trainer and bench/reference/hrm.py)
// train on the same data and exploration draws. Flat arrays are
// [Steps, Batch, ...] row-major.
type Replay struct {
	Steps, Batch int
	Inputs       []Grid  // [Steps·Batch]: step t's candidate puzzles (0 blank)
	Labels       []Grid  // [Steps·Batch]: their solutions
	MinHaltSteps []int32 // [Steps·Batch]: MinHaltSteps of each step
	Puzzles      []int32 // [Steps·Batch]: training-set index (provenance)
	Copies       []int32 // [Steps·Batch]: augmentation copy (provenance)
	Meta         map[string]string
}

// ReplayConfig configures NewReplay.
type ReplayConfig struct {
	Sampler  Sampler
	Steps    int
	Prob     float64 // halt exploration probability (0.1 in the reference)
	MaxSteps int     // halt_max_steps (16 in the reference), ≥ 2
}

// NewReplay draws cfg.Steps batches of set with cfg.Sampler (Fill) and the
// exploration draws MinHaltSteps(Sampler.Seed, t, ...) of each step.
func NewReplay(set *Set, cfg ReplayConfig) (*Replay, error) {
	s := cfg.Sampler
	switch {
	case s.N != set.Len() || s.N < 1:
		return nil, fmt.Errorf("sudoku: replay: sampler over %d puzzles, set holds %d", s.N, set.Len())
	case s.Batch < 1 || cfg.Steps < 1 || s.Aug.NumAug < 0:
		return nil, fmt.Errorf("sudoku: replay: batch %d, steps %d, %d augmentations", s.Batch, cfg.Steps, s.Aug.NumAug)
	case cfg.MaxSteps < 2 || !(cfg.Prob >= 0 && cfg.Prob <= 1):
		return nil, fmt.Errorf("sudoku: replay: halt max steps %d (want ≥ 2), exploration probability %g (want [0, 1])", cfg.MaxSteps, cfg.Prob)
	}
	n := cfg.Steps * s.Batch
	r := &Replay{Steps: cfg.Steps, Batch: s.Batch, Inputs: make([]Grid, n), Labels: make([]Grid, n),
		MinHaltSteps: make([]int32, 0, n), Puzzles: make([]int32, 0, n), Copies: make([]int32, 0, n)}
	for t := range cfg.Steps {
		lo := t * s.Batch
		pz, cp := s.Fill(set, t, r.Inputs[lo:lo+s.Batch], r.Labels[lo:lo+s.Batch])
		for j := range pz {
			r.Puzzles = append(r.Puzzles, int32(pz[j]))
			r.Copies = append(r.Copies, int32(cp[j]))
		}
		r.MinHaltSteps = append(r.MinHaltSteps, MinHaltSteps(s.Seed, t, s.Batch, cfg.Prob, cfg.MaxSteps)...)
	}
	r.Meta = map[string]string{
		"format":                ReplayFormat,
		"steps":                 strconv.Itoa(cfg.Steps),
		"batch":                 strconv.Itoa(s.Batch),
		"seed":                  strconv.FormatUint(s.Seed, 10),
		"num_aug":               strconv.Itoa(s.Aug.NumAug),
		"aug_seed":              strconv.FormatUint(s.Aug.Seed, 10),
		"halt_exploration_prob": strconv.FormatFloat(cfg.Prob, 'g', -1, 64),
		"halt_max_steps":        strconv.Itoa(cfg.MaxSteps),
		"train_count":           strconv.Itoa(set.Len()),
		"train_source":          set.Meta["source"],
	}
	return r, nil
}

// Save writes the replay as safetensors: inputs and labels U8
// [Steps, Batch, 81], min_halt_steps, puzzle and copy I32 [Steps, Batch],
// and r.Meta (format, steps, batch, seed, num_aug, aug_seed,
// halt_exploration_prob, halt_max_steps, train_count, train_source).
func (r *Replay) Save(path string) error {
	grids := func(g []Grid) []byte {
		b := make([]byte, 0, len(g)*Cells)
		for i := range g {
			b = append(b, g[i][:]...)
		}
		return b
	}
	i32 := func(v []int32) []byte {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
		}
		return b
	}
	sb := []int{r.Steps, r.Batch}
	return ckpt.WriteFile(path, []ckpt.Entry{
		{Name: "inputs", DType: tensor.U8, Shape: []int{r.Steps, r.Batch, Cells}, Data: grids(r.Inputs)},
		{Name: "labels", DType: tensor.U8, Shape: []int{r.Steps, r.Batch, Cells}, Data: grids(r.Labels)},
		{Name: "min_halt_steps", DType: tensor.I32, Shape: sb, Data: i32(r.MinHaltSteps)},
		{Name: "puzzle", DType: tensor.I32, Shape: sb, Data: i32(r.Puzzles)},
		{Name: "copy", DType: tensor.I32, Shape: sb, Data: i32(r.Copies)},
	}, r.Meta)
}

// LoadReplay reads a replay file written by Replay.Save, checking the
// format key, every tensor's dtype and shape against steps and batch, and
// every label a valid solution of its input.
func LoadReplay(path string) (*Replay, error) {
	f, err := ckpt.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := replayFrom(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

func replayFrom(f *ckpt.File) (*Replay, error) {
	if got := f.Metadata["format"]; got != ReplayFormat {
		return nil, fmt.Errorf("%w: metadata format %q, want %q", ErrFormat, got, ReplayFormat)
	}
	steps, err1 := strconv.Atoi(f.Metadata["steps"])
	batch, err2 := strconv.Atoi(f.Metadata["batch"])
	if err1 != nil || err2 != nil || steps < 1 || batch < 1 {
		return nil, fmt.Errorf("%w: metadata steps %q, batch %q", ErrFormat, f.Metadata["steps"], f.Metadata["batch"])
	}
	r := &Replay{Steps: steps, Batch: batch, Meta: f.Metadata}
	get := func(name string, dt tensor.DType, shape ...int) ([]byte, error) {
		info, b, err := f.Bytes(name)
		if err != nil {
			return nil, err
		}
		if info.DType != dt || !tensor.SameShape(info.Shape, shape) {
			return nil, fmt.Errorf("%w: %s is %v %v, want %v %v", ErrFormat, name, info.DType, info.Shape, dt, shape)
		}
		return b, nil
	}
	for _, g := range []struct {
		name string
		dst  *[]Grid
	}{{"inputs", &r.Inputs}, {"labels", &r.Labels}} {
		b, err := get(g.name, tensor.U8, steps, batch, Cells)
		if err != nil {
			return nil, err
		}
		*g.dst = make([]Grid, steps*batch)
		for i := range *g.dst {
			copy((*g.dst)[i][:], b[i*Cells:])
		}
	}
	for _, v := range []struct {
		name string
		dst  *[]int32
	}{{"min_halt_steps", &r.MinHaltSteps}, {"puzzle", &r.Puzzles}, {"copy", &r.Copies}} {
		b, err := get(v.name, tensor.I32, steps, batch)
		if err != nil {
			return nil, err
		}
		*v.dst = make([]int32, steps*batch)
		for i := range *v.dst {
			(*v.dst)[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
		}
	}
	for i := range r.Inputs {
		if err := CheckSolution(r.Inputs[i], r.Labels[i]); err != nil {
			return nil, fmt.Errorf("step %d row %d: %w", i/batch, i%batch, err)
		}
	}
	return r, nil
}
