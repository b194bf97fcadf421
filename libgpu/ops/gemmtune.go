package ops

// GEMM algorithm selection. cuBLASLt's heuristic ranks algorithms by a
// model of the GPU; for the shapes of a training step the measured best is
// often another one (on an H100 the GPT's weight-gradient GEMMs got
// split-K algorithms whose reduce kernels cost 169 µs per step; see
// bench/notes/gpt-step.md). So the first time the GEMM family runs a spec
// eagerly, the CUDA backend times the heuristic's first gemmTuneN
// candidates on scratch outputs (the caller's inputs, no side effects) and
// keeps the fastest for that spec (LtHandle.SetAlgo). The choice — the
// candidate's index in the heuristic's list, which is deterministic for a
// device, library version and spec — is kept in a file beside the kernel
// cache, so every later process on the machine takes the same algorithm:
// runs stay bitwise reproducible across processes (a resumed run, a graph
// and an eager run compared in two processes).
//
// GPUKIT_GEMM_TUNE=0 turns it off (the heuristic's first choice, as
// before).

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/exec"
	"gpukit/libgpu/kernels"
)

const (
	gemmTuneN     = 8   // candidates timed
	gemmTuneReps  = 5   // timed runs per candidate (the minimum is kept)
	gemmTuneFlops = 1e8 // smaller products keep the heuristic's choice
)

// gemmTuner is a CUDA backend's per-spec choice.
type gemmTuner struct {
	done map[cuda.GemmSpec]bool
}

// gemmChoices is the on-disk table: key → candidate index.
var gemmChoices struct {
	sync.Mutex
	loaded bool
	path   string
	m      map[string]int
}

func gemmTuneOn() bool { return os.Getenv("GPUKIT_GEMM_TUNE") != "0" }

func gemmChoicePath() string {
	dir, err := kernels.DefaultCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "gemm-algos.json")
}

// loadChoices reads the table once per process (a missing or bad file is
// an empty table).
func loadChoices() {
	if gemmChoices.loaded {
		return
	}
	gemmChoices.loaded = true
	gemmChoices.m = map[string]int{}
	gemmChoices.path = gemmChoicePath()
	if gemmChoices.path == "" {
		return
	}
	if b, err := os.ReadFile(gemmChoices.path); err == nil {
		_ = json.Unmarshal(b, &gemmChoices.m)
	}
}

// saveChoice adds key → i to the table and rewrites the file atomically,
// merging with what other processes wrote meanwhile (first writer wins).
func saveChoice(key string, i int) int {
	gemmChoices.Lock()
	defer gemmChoices.Unlock()
	loadChoices()
	if gemmChoices.path == "" {
		gemmChoices.m[key] = i
		return i
	}
	onDisk := map[string]int{}
	if b, err := os.ReadFile(gemmChoices.path); err == nil {
		_ = json.Unmarshal(b, &onDisk)
	}
	if j, ok := onDisk[key]; ok {
		i = j
	}
	onDisk[key] = i
	for k, v := range gemmChoices.m {
		if _, ok := onDisk[k]; !ok {
			onDisk[k] = v
		}
	}
	gemmChoices.m = onDisk
	if err := os.MkdirAll(filepath.Dir(gemmChoices.path), 0o755); err == nil {
		if b, err := json.MarshalIndent(onDisk, "", " "); err == nil {
			tmp := fmt.Sprintf("%s.%d.tmp", gemmChoices.path, os.Getpid())
			if os.WriteFile(tmp, b, 0o644) == nil {
				_ = os.Rename(tmp, gemmChoices.path)
			}
		}
	}
	return i
}

func lookupChoice(key string) (int, bool) {
	gemmChoices.Lock()
	defer gemmChoices.Unlock()
	loadChoices()
	i, ok := gemmChoices.m[key]
	return i, ok
}

// tuneKey names a spec on this device and library.
func (c *cudaImpl) tuneKey(spec cuda.GemmSpec) string {
	v, _ := cuda.LtVersion()
	return fmt.Sprintf("%s|%d|%+v", c.Device(), v, spec)
}

// tune picks spec's algorithm before its first eager run (see the file
// comment). Failures leave the heuristic's choice; only a CUDA error
// while timing is returned.
func (c *cudaImpl) tune(spec cuda.GemmSpec, args cuda.GemmArgs) error {
	tuner := exec.StateOf[gemmTuner](c.CUDA)
	if tuner.done == nil {
		tuner.done = map[cuda.GemmSpec]bool{}
	}
	if tuner.done[spec] || !gemmTuneOn() {
		return nil
	}
	batch := max(spec.Batch, 1)
	if 2*float64(spec.M)*float64(spec.N)*float64(spec.K)*float64(batch) < gemmTuneFlops {
		tuner.done[spec] = true
		return nil
	}
	if capturing, err := c.Stream().IsCapturing(); err != nil || capturing {
		return nil // tuned on the next eager run
	}
	tuner.done[spec] = true
	cands, err := c.Lt().Candidates(spec, gemmTuneN)
	if err != nil || len(cands) < 2 {
		return nil
	}
	key := c.tuneKey(spec)
	if i, ok := lookupChoice(key); ok {
		if i >= 0 && i < len(cands) {
			return c.Lt().SetAlgo(spec, cands[i])
		}
		return nil
	}
	best, err := c.timeCandidates(spec, args, cands)
	if err != nil || best < 0 {
		return err
	}
	best = saveChoice(key, best)
	if best >= len(cands) {
		return nil
	}
	return c.Lt().SetAlgo(spec, cands[best])
}

// timeCandidates runs each candidate gemmTuneReps times on scratch outputs
// and returns the index of the fastest (−1 if none ran).
func (c *cudaImpl) timeCandidates(spec cuda.GemmSpec, args cuda.GemmArgs, cands []cuda.LtAlgo) (int, error) {
	elem := int64(4)
	if spec.DType == cuda.R16BF {
		elem = 2
	}
	batch := int64(max(spec.Batch, 1))
	dBytes := elem * int64(spec.LDD) * int64(spec.N)
	if batch > 1 {
		dBytes = elem * (spec.StrideD*(batch-1) + int64(spec.LDD)*int64(spec.N))
	}
	d, err := c.Scratch("tune_d", dBytes)
	if err != nil {
		return -1, nil
	}
	ta := args
	ta.D = d
	if ta.C != 0 {
		ta.C = d
	}
	if args.Aux != 0 {
		if ta.Aux, err = c.Scratch("tune_aux", dBytes); err != nil {
			return -1, nil
		}
	}
	if spec.Epilogue == cuda.EpilogueBGradB || spec.Epilogue == cuda.EpilogueBGradA {
		if ta.Bias, err = c.Scratch("tune_bias", 4*int64(max(spec.M, spec.N))); err != nil {
			return -1, nil
		}
	}
	start, err := cuda.EventCreate(cuda.EventDefault)
	if err != nil {
		return -1, err
	}
	defer start.Destroy()
	end, err := cuda.EventCreate(cuda.EventDefault)
	if err != nil {
		return -1, err
	}
	defer end.Destroy()
	best, bestMS := -1, math.Inf(1)
	for i, algo := range cands {
		if algo.WorkspaceSize > ta.WorkspaceSize {
			continue
		}
		if err := c.Lt().MatmulAlgo(spec, ta, algo, c.Stream()); err != nil { // warm-up; also rejects
			continue
		}
		ms := math.Inf(1)
		for r := 0; r < gemmTuneReps; r++ {
			if err := start.Record(c.Stream()); err != nil {
				return -1, err
			}
			if err := c.Lt().MatmulAlgo(spec, ta, algo, c.Stream()); err != nil {
				return -1, err
			}
			if err := end.Record(c.Stream()); err != nil {
				return -1, err
			}
			if err := end.Synchronize(); err != nil {
				return -1, err
			}
			t, err := cuda.EventElapsed(start, end)
			if err != nil {
				return -1, err
			}
			ms = math.Min(ms, float64(t))
		}
		if ms < bestMS {
			best, bestMS = i, ms
		}
	}
	return best, nil
}
