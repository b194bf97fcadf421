package sudoku

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"gpukit/libgpu/data"
)

// Difficulties are qqwing's --difficulty values, easiest first ("any"
// takes whatever the generator makes). qqwing rates a puzzle by the
// techniques its solver needs: "expert" puzzles need guessing.
var Difficulties = []string{"simple", "easy", "intermediate", "expert", "any"}

// ErrTools reports that qqwing or faketime is missing; its message says
// how to install them.
var ErrTools = errors.New("sudoku: qqwing and faketime are needed (Debian: apt-get install qqwing faketime; make deps installs them)")

// Install is the hint printed with ErrTools.
const Install = "apt-get install qqwing faketime"

// Puzzle is a puzzle and its solution.
type Puzzle struct {
	Input, Label Grid
}

// GenConfig configures Generate.
type GenConfig struct {
	Count      int    // distinct puzzles wanted
	Difficulty string // one of Difficulties
	Seed       uint64 // decides qqwing's clock (see ShardClock), hence every puzzle
	// Jobs is how many qqwing processes run at once (≤ 0: runtime.NumCPU());
	// it changes the speed, never the puzzles.
	Jobs int
	// Progress, when set, is called (from several goroutines, never at once)
	// with the number of puzzles the qqwing processes have printed so far.
	Progress func(printed int)
}

// GenStats says what Generate did.
type GenStats struct {
	Version    string // qqwing --version, e.g. "qqwing 1.3.4"
	Shards     int    // qqwing processes whose puzzles were used
	Printed    int    // puzzles those processes printed
	Duplicates int    // of those, dropped as copies of an earlier one (Fingerprint)
}

// ShardSize is the most puzzles one qqwing process makes.
const ShardSize = 64

// ShardClock is the time (seconds since 1970) qqwing's clock is frozen at
// in shard k of a run with this seed: 2000-01-01 plus a value below 2³⁰
// drawn from the seed (data.EpochSeed), plus k. qqwing takes no seed: it
// seeds the C library's rand() with time(0) once and draws everything from
// it (src/cpp/main.cpp, 1.3.4), so frozen under faketime at a given second
// it prints the same puzzles every time.
func ShardClock(seed uint64, k int) int64 {
	return 946684800 + int64(data.EpochSeed(seed, 0)%(1<<30)) + int64(k)
}

// Tools checks that qqwing and faketime are installed and returns
// qqwing's version line; the error wraps ErrTools.
func Tools() (string, error) {
	for _, t := range []string{"qqwing", "faketime"} {
		if _, err := exec.LookPath(t); err != nil {
			return "", fmt.Errorf("%w: %s is not in PATH", ErrTools, t)
		}
	}
	out, err := exec.Command("qqwing", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%w: qqwing --version: %v", ErrTools, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Generate makes cfg.Count puzzles with qqwing, every one checked: the
// solution qqwing prints is valid and keeps the givens, and Solve finds
// it to be the only one. Puzzles come from shards: qqwing processes of at
// most ShardSize puzzles each, run cfg.Jobs at a time, shard k under
// faketime at ShardClock(cfg.Seed, k) (shard sizes depend only on Count).
// Shards are read in order and a puzzle whose Fingerprint an earlier one
// has is dropped, so the result is a function of (Count, Difficulty, Seed)
// and the qqwing and C library versions (glibc's rand() has not changed
// since 2.0). A failed check is an error, as is a missing tool (ErrTools).
func Generate(ctx context.Context, cfg GenConfig) ([]Puzzle, GenStats, error) {
	var st GenStats
	if cfg.Count <= 0 {
		return nil, st, fmt.Errorf("sudoku: Generate: count %d", cfg.Count)
	}
	if !slices.Contains(Difficulties, cfg.Difficulty) {
		return nil, st, fmt.Errorf("sudoku: difficulty %q: want one of %s", cfg.Difficulty, strings.Join(Difficulties, ", "))
	}
	v, err := Tools()
	if err != nil {
		return nil, st, err
	}
	st.Version = v
	jobs := cfg.Jobs
	if jobs <= 0 {
		jobs = runtime.NumCPU()
	}
	size := min(ShardSize, cfg.Count)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // orders Progress calls
		printed atomic.Int64
		sem     = make(chan struct{}, jobs)
		shards  []chan shardResult
	)
	defer wg.Wait() // after cancel: no qqwing outlives Generate
	launch := func() {
		k := len(shards)
		ch := make(chan shardResult, 1)
		shards = append(shards, ch)
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				ch <- shardResult{err: ctx.Err()}
				return
			}
			defer func() { <-sem }()
			ch <- runShard(ctx, ShardClock(cfg.Seed, k), size, cfg.Difficulty, func() {
				n := printed.Add(1)
				if cfg.Progress != nil {
					mu.Lock()
					cfg.Progress(int(n))
					mu.Unlock()
				}
			})
		}()
	}
	for range (cfg.Count + size - 1) / size {
		launch()
	}
	seen := make(map[uint64]bool, cfg.Count)
	out := make([]Puzzle, 0, cfg.Count)
	for k := 0; len(out) < cfg.Count; k++ {
		// Duplicates left us short: keep jobs shards running ahead.
		for len(shards) < k+jobs {
			launch()
		}
		r := <-shards[k]
		if r.err != nil {
			return nil, st, fmt.Errorf("sudoku: qqwing shard %d (clock %d): %w", k, ShardClock(cfg.Seed, k), r.err)
		}
		st.Shards++
		for _, p := range r.puzzles {
			if len(out) == cfg.Count {
				break
			}
			st.Printed++
			if sol, ok := Unique(p.Input); !ok || sol != p.Label {
				return nil, st, fmt.Errorf("%w: qqwing shard %d printed %s, which has not exactly one solution or not its printed one", ErrInvalid, k, p.Input)
			}
			f := Fingerprint(p.Input, p.Label)
			if seen[f] {
				st.Duplicates++
				continue
			}
			seen[f] = true
			out = append(out, p)
		}
	}
	return out, st, nil
}

type shardResult struct {
	puzzles []Puzzle
	err     error
}

// runShard runs one qqwing process frozen at clock and parses its CSV
// output ("Puzzle,Solution," then one "puzzle,solution," line per
// puzzle), calling onPuzzle per line read.
func runShard(ctx context.Context, clock int64, n int, difficulty string, onPuzzle func()) shardResult {
	cmd := exec.CommandContext(ctx, "faketime", "-f", strconv.FormatInt(clock, 10),
		"qqwing", "--generate", strconv.Itoa(n), "--difficulty", difficulty, "--symmetry", "none", "--csv", "--solution")
	cmd.Env = append(os.Environ(), "FAKETIME_FMT=%s")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return shardResult{err: err}
	}
	if err := cmd.Start(); err != nil {
		return shardResult{err: err}
	}
	var res shardResult
	sc := bufio.NewScanner(stdout)
	for line := 0; sc.Scan(); line++ {
		text := sc.Text()
		if line == 0 {
			if text != "Puzzle,Solution," {
				res.err = fmt.Errorf("%w: qqwing's first line is %q, want the CSV header \"Puzzle,Solution,\"", ErrFormat, text)
				break
			}
			continue
		}
		f := strings.Split(text, ",")
		if len(f) != 3 || f[2] != "" {
			res.err = fmt.Errorf("%w: qqwing line %d is %q, want \"puzzle,solution,\"", ErrFormat, line+1, text)
			break
		}
		var p Puzzle
		if p.Input, err = ParseGrid(f[0]); err == nil {
			p.Label, err = ParseGrid(f[1])
		}
		if err == nil {
			err = CheckSolution(p.Input, p.Label)
		}
		if err != nil {
			res.err = fmt.Errorf("qqwing line %d: %w", line+1, err)
			break
		}
		res.puzzles = append(res.puzzles, p)
		onPuzzle()
	}
	if res.err != nil {
		_ = cmd.Process.Kill()
	}
	werr := cmd.Wait()
	switch {
	case res.err != nil:
	case ctx.Err() != nil:
		res.err = ctx.Err()
	case werr != nil:
		res.err = fmt.Errorf("%v: %s", werr, strings.TrimSpace(stderr.String()))
	case len(res.puzzles) != n:
		res.err = fmt.Errorf("qqwing printed %d puzzles, asked for %d: %s", len(res.puzzles), n, strings.TrimSpace(stderr.String()))
	}
	return res
}
