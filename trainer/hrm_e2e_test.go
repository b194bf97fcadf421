package main

// The HRM through the real binary on the host (CI): a tiny model learns a
// few Sudoku puzzles, a resumed run equals an uninterrupted one, eval and
// solve print what TOOLS.md says, and the help lists hrm's flags only.

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data/sudoku"
)

// hrmTiny are the flags of a tiny HRM that trains in seconds on the host:
// width 32, one block per level, 2 × 1 cycles, at most 4 segments.
var hrmTiny = []string{"--hidden", "32", "--heads", "2", "--h-layers", "1", "--l-layers", "1", "--h-cycles", "2",
	"--l-cycles", "1", "--expansion", "2", "--halt-max-steps", "4"}

// uniquePuzzles are n Sudoku puzzles with one solution each: a fixed
// solution under random symmetries (sudoku.RandomTransform), its cells
// blanked in a random order as long as the solver finds the solution
// unique, up to blanks blanks.
func uniquePuzzles(r *rand.Rand, n, blanks int) *sudoku.Set {
	var base sudoku.Grid
	for i := range base {
		row, col := i/9, i%9
		base[i] = uint8((row*3+row/3+col)%9 + 1)
	}
	s := &sudoku.Set{Meta: map[string]string{"source": "test", "split": "train"}}
	for range n {
		sol := sudoku.RandomTransform(r).Apply(base)
		p := sol
		k := 0
		for _, i := range r.Perm(sudoku.Cells) {
			if k == blanks {
				break
			}
			v := p[i]
			p[i] = 0
			if _, ok := sudoku.Unique(p); !ok {
				p[i] = v
				continue
			}
			k++
		}
		s.Inputs, s.Labels = append(s.Inputs, p), append(s.Labels, sol)
	}
	return s
}

// hrmData writes a data directory whose training and test sets are the
// same n puzzles (the tests measure memorisation), and returns it with
// the puzzles.
func hrmData(t *testing.T, seed uint64, n int) (string, *sudoku.Set) {
	t.Helper()
	t.Logf("puzzle seed %d", seed)
	set := uniquePuzzles(rand.New(rand.NewPCG(seed, 5)), n, 40)
	dir := t.TempDir()
	for _, f := range []string{"train.safetensors", "test.safetensors"} {
		if err := sudoku.Save(filepath.Join(dir, f), set); err != nil {
			t.Fatal(err)
		}
	}
	return dir, set
}

// hrmRunLine is a line of trainer run --model hrm: a loss line or an
// evaluation line.
type hrmRunLine struct {
	Step          int      `json:"step"`
	Loss          *float64 `json:"loss"`
	LMLoss        *float64 `json:"lm_loss"`
	Halted        *float64 `json:"halted"`
	Count         *float64 `json:"count"`
	TestCell      *float64 `json:"test_cell_accuracy"`
	TestExact     *float64 `json:"test_exact_accuracy"`
	TestSegments  *float64 `json:"test_mean_segments"`
	TestPuzzles   *int     `json:"test_puzzles"`
	SequencesPerS *float64 `json:"sequences_per_s"`
}

func hrmLines(t *testing.T, stdout string) []hrmRunLine {
	t.Helper()
	var out []hrmRunLine
	for _, s := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var l hrmRunLine
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("not a JSON line: %q", s)
		}
		out = append(out, l)
	}
	return out
}

// hrmTrained is one tiny HRM trained on 4 puzzles, shared by the tests
// that need a trained checkpoint.
var hrmTrained struct {
	once        sync.Once
	root        string
	dir, data   string
	set         *sudoku.Set
	init, lines string
	err         string
}

const hrmLearnSteps = 40

// hrmCleanup removes the shared trained run (TestMain, after the tests).
func hrmCleanup() {
	if hrmTrained.root != "" {
		os.RemoveAll(hrmTrained.root)
	}
}

func trainedHRM(t *testing.T) (dir, data string, set *sudoku.Set) {
	t.Helper()
	h := &hrmTrained
	h.once.Do(func() {
		root, err := os.MkdirTemp("", "hrm-trained")
		if err != nil {
			h.err = err.Error()
			return
		}
		h.root = root
		h.data = filepath.Join(root, "data")
		if err := os.Mkdir(h.data, 0o755); err != nil {
			h.err = err.Error()
			return
		}
		h.set = uniquePuzzles(rand.New(rand.NewPCG(20261128, 5)), 4, 40)
		for _, f := range []string{"train.safetensors", "test.safetensors"} {
			if err := sudoku.Save(filepath.Join(h.data, f), h.set); err != nil {
				h.err = err.Error()
				return
			}
		}
		h.dir = filepath.Join(root, "run")
		h.init = filepath.Join(root, "init.safetensors")
		args := append([]string{"--model", "hrm", "--data", h.data, "--batch", "4", "--num-aug", "0", "--lr", "1e-2",
			"--puzzle-emb-lr", "1e-2", "--weight-decay", "0.1", "--puzzle-emb-weight-decay", "0.1", "--warmup", "5",
			"--seed", "3"}, hrmTiny...)
		if out, err := exec.Command(filepath.Join(binDir, "trainer"), append([]string{"init", "--out", h.init}, args...)...).CombinedOutput(); err != nil {
			h.err = fmt.Sprintf("trainer init: %v\n%s", err, out)
			return
		}
		cmd := exec.Command(filepath.Join(binDir, "trainer"), append([]string{"run", "--out", h.dir, "--device", "host",
			"--steps", strconv.Itoa(hrmLearnSteps), "--log-every", "1", "--eval-every", "20"}, args...)...)
		var so, se strings.Builder
		cmd.Stdout, cmd.Stderr = &so, &se
		if err := cmd.Run(); err != nil {
			h.err = fmt.Sprintf("trainer run: %v\n%s", err, se.String())
			return
		}
		h.lines = so.String()
	})
	if h.err != "" {
		t.Fatal(h.err)
	}
	return h.dir, h.data, h.set
}

// TestHRMLearnsPuzzles: a tiny HRM (width 32, one block per level) trains
// 40 segment steps on the host on 4 puzzles with AdamATan2 and sign-SGD
// through trainer run: its loss falls, and trainer eval of its checkpoint
// gets far more cells of those puzzles right than of the initial weights
// (trainer init with the same flags), as do the run's own evaluations.
func TestHRMLearnsPuzzles(t *testing.T) {
	dir, data, _ := trainedHRM(t)
	lines := hrmLines(t, hrmTrained.lines)
	var losses []float64
	var evals []hrmRunLine
	for _, l := range lines {
		switch {
		case l.Loss != nil:
			if l.LMLoss == nil || l.Halted == nil || l.Count == nil || *l.Halted != *l.Count || l.SequencesPerS == nil {
				t.Fatalf("loss line of step %d without hrm.py's fields", l.Step)
			}
			losses = append(losses, *l.LMLoss)
		case l.TestCell != nil:
			evals = append(evals, l)
		}
	}
	if len(losses) != hrmLearnSteps || len(evals) != 2 || evals[1].Step != hrmLearnSteps || *evals[1].TestPuzzles != 4 {
		t.Fatalf("%d loss lines and %d evaluations (%+v)", len(losses), len(evals), evals)
	}
	mean := func(v []float64) float64 {
		s := 0.0
		for _, x := range v {
			s += x
		}
		return s / float64(len(v))
	}
	first, last := mean(losses[:5]), mean(losses[len(losses)-5:])
	if !(last < 0.7*first) {
		t.Errorf("lm loss %.4f over the first 5 steps, %.4f over the last 5", first, last)
	}
	eval := func(ckpt string) map[string]any {
		r := trainer(t, "eval", "--ckpt", ckpt, "--data", data, "--device", "host")
		mustOK(t, r)
		var v map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
			t.Fatalf("eval printed %q", r.stdout)
		}
		return v
	}
	before, after := eval(hrmTrained.init), eval(filepath.Join(dir, "model.safetensors"))
	t.Logf("lm loss %.4f → %.4f; cell accuracy %.3f → %.3f (run's evaluations %.3f, %.3f)", first, last,
		before["cell_accuracy"], after["cell_accuracy"], *evals[0].TestCell, *evals[1].TestCell)
	b, a := before["cell_accuracy"].(float64), after["cell_accuracy"].(float64)
	if !(a > b+0.3 && a > 0.5) {
		t.Errorf("cell accuracy %.3f from the initial weights, %.3f after training", b, a)
	}
	if a != *evals[1].TestCell {
		t.Errorf("trainer eval's cell accuracy %v, the run's last evaluation %v", a, *evals[1].TestCell)
	}
}

// TestHRMEval: trainer eval of a run directory reads its best.safetensors
// (named on stderr) and prints {exact_accuracy, cell_accuracy,
// mean_segments, puzzles, halting, seconds, puzzles_per_s, ckpt, data};
// --no-halt runs every puzzle --halt-max-steps (4) segments, halting at
// most that; bad flags exit 2 before any work.
func TestHRMEval(t *testing.T) {
	dir, data, _ := trainedHRM(t)
	for _, noHalt := range []bool{false, true} {
		args := []string{"eval", "--ckpt", dir, "--data", filepath.Join(data, "test.safetensors"), "--device", "host", "--batch", "3"}
		if noHalt {
			args = append(args, "--no-halt")
		}
		r := trainer(t, args...)
		mustOK(t, r)
		var v struct {
			Exact, Cell, Segments *float64
			Puzzles               int
			Halting               *bool
			Seconds, Rate         *float64
			Ckpt, Data            string
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil || strings.Count(r.stdout, "\n") != 1 {
			t.Fatalf("eval printed %q", r.stdout)
		}
		for k, dst := range map[string]any{"exact_accuracy": &v.Exact, "cell_accuracy": &v.Cell, "mean_segments": &v.Segments,
			"puzzles": &v.Puzzles, "halting": &v.Halting, "seconds": &v.Seconds, "puzzles_per_s": &v.Rate, "ckpt": &v.Ckpt, "data": &v.Data} {
			if err := json.Unmarshal(raw[k], dst); err != nil {
				t.Fatalf("eval's %s in %q: %v", k, r.stdout, err)
			}
		}
		if v.Exact == nil || v.Cell == nil || v.Segments == nil || v.Halting == nil || *v.Halting == noHalt || v.Puzzles != 4 ||
			v.Ckpt != filepath.Join(dir, "best.safetensors") || !strings.Contains(r.stderr, "eval reads "+v.Ckpt) {
			t.Fatalf("eval printed %q, stderr %q", r.stdout, r.stderr)
		}
		if noHalt && *v.Segments != 4 || !noHalt && !(*v.Segments >= 1 && *v.Segments <= 4) {
			t.Errorf("--no-halt %v: mean segments %v", noHalt, *v.Segments)
		}
	}
	for _, c := range [][]string{{"--batch", "0"}, {"--n", "-1"}} {
		r := trainer(t, append([]string{"eval", "--ckpt", dir, "--data", data, "--device", "host"}, c...)...)
		if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "trainer: usage: "+c[0]) {
			t.Errorf("eval %v: exit %d, stdout %q, stderr %q", c, r.code, r.stdout, r.stderr)
		}
	}
}

// TestHRMSolve: trainer solve reads puzzles from stdin ('.' and '0'
// blanks, blank lines skipped) and prints one JSON line per puzzle in
// order — its line number, an 81-character solution, the segments used
// and whether the solution is valid — which the test checks against
// libgpu/data/sudoku (CheckSolution, and the solver's unique solution);
// a trained tiny model keeps the givens. A bad line is refused by its
// number (exit 1 after the rest are solved); no valid puzzle: exit 2.
func TestHRMSolve(t *testing.T) {
	dir, _, set := trainedHRM(t)
	var in strings.Builder
	want := map[int]sudoku.Grid{}
	n := 0
	add := func(s string) { in.WriteString(s + "\n"); n++ }
	for i, p := range set.Inputs {
		s := p.String()
		if i%2 == 1 {
			s = strings.ReplaceAll(s, ".", "0")
		}
		add(s)
		want[n] = p
		if i == 1 {
			add("")
			add(s[:80]) // refused: 80 characters
		}
	}
	add("11" + set.Inputs[0].String()[2:]) // refused: a digit twice in a row
	run := func(stdin string, args ...string) result {
		cmd := exec.Command(filepath.Join(binDir, "trainer"), append([]string{"solve", "--ckpt", dir, "--device", "host"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var so, se strings.Builder
		cmd.Stdout, cmd.Stderr = &so, &se
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return result{so.String(), se.String(), code}
	}
	r := run(in.String(), "--batch", "3")
	if r.code != 1 || !strings.Contains(r.stderr, "line 4 refused") || !strings.Contains(r.stderr, fmt.Sprintf("line %d refused", n)) ||
		!strings.Contains(r.stderr, fmt.Sprintf("2 of %d lines refused", n)) {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	outs := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(outs) != len(set.Inputs) {
		t.Fatalf("%d lines for %d puzzles: %q", len(outs), len(set.Inputs), r.stdout)
	}
	kept, givens := 0, 0
	prev := 0
	for _, o := range outs {
		var s struct {
			Line     int    `json:"line"`
			Solution string `json:"solution"`
			Segments int    `json:"segments"`
			Valid    bool   `json:"valid"`
		}
		if err := json.Unmarshal([]byte(o), &s); err != nil {
			t.Fatalf("not a JSON line: %q", o)
		}
		p, ok := want[s.Line]
		if !ok || s.Line <= prev || len(s.Solution) != sudoku.Cells || s.Segments < 1 || s.Segments > 4 {
			t.Fatalf("line %q", o)
		}
		prev = s.Line
		g, err := sudoku.ParseGrid(s.Solution)
		if err != nil && !strings.Contains(s.Solution, ".") {
			t.Fatalf("solution %q: %v", s.Solution, err)
		}
		if v := sudoku.CheckSolution(p, g) == nil; v != s.Valid {
			t.Errorf("line %d: valid %v, the checker says %v", s.Line, s.Valid, v)
		}
		sol, unique := sudoku.Unique(p)
		if !unique || (s.Valid && g != sol) {
			t.Errorf("line %d: a valid solution other than the solver's %s", s.Line, sol)
		}
		for i, v := range p {
			if v != 0 {
				givens++
				if g[i] == v {
					kept++
				}
			}
		}
	}
	t.Logf("givens kept %d of %d", kept, givens)
	if float64(kept) < 0.95*float64(givens) {
		t.Errorf("the trained model kept %d of %d givens", kept, givens)
	}
	for _, stdin := range []string{"", "\n123\n"} {
		r := run(stdin)
		if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "no valid puzzle on stdin") {
			t.Errorf("stdin %q: exit %d, stdout %q, stderr %q", stdin, r.code, r.stdout, r.stderr)
		}
	}
}

// TestHRMResumeEqualsUninterrupted: a run of 10 segment steps, and one of
// 7 continued to 10 with --resume (a checkpoint between segments, with
// sequences in the middle of their puzzles), write the same lines
// (timings aside) and the same model and state files, bytes for bytes:
// the carried state, the optimizer state and the data position
// are in the state file; best.safetensors holds the same tensors.
func TestHRMResumeEqualsUninterrupted(t *testing.T) {
	data, _ := hrmData(t, 7, 6)
	common := append([]string{"run", "--model", "hrm", "--data", data, "--device", "host", "--batch", "3", "--num-aug", "3",
		"--log-every", "1", "--eval-every", "3", "--eval-n", "4", "--warmup", "2", "--lr", "3e-3", "--halt-exploration-prob", "0.5"},
		hrmTiny...)
	common = append(common, "--hidden", "16", "--heads", "1", "--halt-max-steps", "3")
	a, b := t.TempDir(), t.TempDir()
	ra := trainer(t, append(common, "--out", a, "--force", "--steps", "10")...)
	mustOK(t, ra)
	mustOK(t, trainer(t, append(common, "--out", b, "--force", "--steps", "7")...))
	rb := trainer(t, "run", "--resume", b, "--steps", "10")
	mustOK(t, rb)
	strip := func(dir string) []string {
		raw, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(s), &m); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"sequences_per_s", "step_ms", "elapsed_s"} {
				delete(m, k)
			}
			j, _ := json.Marshal(m)
			out = append(out, string(j))
		}
		return out
	}
	la, lb := strip(a), strip(b)
	// b's metrics also hold the evaluation at the end of its first part
	// (step 7), which the uninterrupted run does not make.
	var lb2 []string
	for _, s := range lb {
		if !strings.HasPrefix(s, `{"step":7,"test_`) {
			lb2 = append(lb2, s)
		}
	}
	if strings.Join(la, "\n") != strings.Join(lb2, "\n") || len(la) != 10+4 {
		t.Fatalf("uninterrupted:\n%s\nresumed:\n%s", strings.Join(la, "\n"), strings.Join(lb, "\n"))
	}
	halted := 0
	for _, l := range hrmLines(t, ra.stdout) {
		if l.Step == 7 && l.Halted != nil {
			halted = int(*l.Halted)
		}
	}
	if halted == 3 {
		t.Errorf("every sequence halted at step 7: the checkpoint carries no puzzle in flight")
	}
	for _, f := range []string{"model.safetensors", "state.safetensors"} {
		x, err1 := os.ReadFile(filepath.Join(a, f))
		y, err2 := os.ReadFile(filepath.Join(b, f))
		if err1 != nil || err2 != nil || string(x) != string(y) {
			t.Errorf("%s differs after --resume (%v, %v)", f, err1, err2)
		}
	}
	// best.safetensors: the same tensors of the same step (its config
	// metadata is the run's when it was written: --steps 7 or 10).
	x, err1 := ckpt.ReadFile(filepath.Join(a, "best.safetensors"))
	y, err2 := ckpt.ReadFile(filepath.Join(b, "best.safetensors"))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if x.Metadata["step"] != y.Metadata["step"] || x.Metadata["val_loss"] != y.Metadata["val_loss"] || len(x.Names()) != len(y.Names()) {
		t.Errorf("best.safetensors of step %s (%s) and %s (%s)", x.Metadata["step"], x.Metadata["val_loss"], y.Metadata["step"], y.Metadata["val_loss"])
	}
	for _, n := range x.Names() {
		_, bx, _ := x.Bytes(n)
		_, by, err := y.Bytes(n)
		if err != nil || string(bx) != string(by) {
			t.Errorf("best.safetensors: %s differs (%v)", n, err)
		}
	}
}

// TestHRMFlags: trainer run --model hrm --help lists hrm's flags and no
// other model's, the others' help none of hrm's; trainer solve and eval
// of an HRM checkpoint list theirs; bad values exit 2 with one line
// before anything is written.
func TestHRMFlags(t *testing.T) {
	r := trainer(t, "run", "--model", "hrm", "--help")
	mustOK(t, r)
	for _, f := range []string{"--halt-max-steps", "--h-cycles", "--l-cycles", "--puzzle-emb-lr", "--num-aug", "--data-seed", "--eval-n"} {
		if !strings.Contains(r.stdout, f+" ") {
			t.Errorf("run --model hrm --help lacks %s", f)
		}
	}
	for _, f := range []string{"--epochs", "--layers", "--channels", "--optim", "--block"} {
		if strings.Contains(r.stdout, f+" ") {
			t.Errorf("run --model hrm --help lists %s", f)
		}
	}
	for _, m := range []string{"mlp", "gpt", "unet"} {
		r := trainer(t, "run", "--model", m, "--help")
		if strings.Contains(r.stdout, "--halt-max-steps") || strings.Contains(r.stdout, "--h-cycles") {
			t.Errorf("run --model %s --help lists hrm's flags", m)
		}
	}
	r = trainer(t, "solve", "--help")
	if !strings.Contains(r.stdout, "--no-halt") || !strings.Contains(r.stdout, "--batch") {
		t.Errorf("solve --help: %s", r.stdout)
	}
	init := filepath.Join(t.TempDir(), "init.safetensors")
	mustOK(t, trainer(t, append([]string{"init", "--model", "hrm", "--data", ".", "--out", init}, hrmTiny...)...))
	r = trainer(t, "eval", "--ckpt", init, "--help")
	if !strings.Contains(r.stdout, "--no-halt") || strings.Contains(r.stdout, "--eval-batches") {
		t.Errorf("eval --ckpt HRM --help: %s", r.stdout)
	}
	out := filepath.Join(t.TempDir(), "run")
	data, _ := hrmData(t, 1, 1)
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--halt-max-steps", "1"}, "--halt-max-steps 1"},
		{[]string{"--hidden", "36", "--heads", "4"}, "head dimension 9"},
		{[]string{"--lr", "0"}, "--lr 0"},
		{[]string{"--epochs", "2"}, "--epochs is not a flag of --model hrm but of --model mlp"},
		{[]string{"--data", ""}, "--data DIR is required"},
	} {
		r := trainer(t, append([]string{"run", "--model", "hrm", "--data", data, "--out", out}, c.args...)...)
		if r.code != 2 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("%v: exit %d, stderr %q", c.args, r.code, r.stderr)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%v: --out made", c.args)
		}
	}
	mlp := filepath.Join(t.TempDir(), "mlp.safetensors")
	mustOK(t, trainer(t, "init", "--model", "mlp", "--out", mlp))
	r = trainer(t, "solve", "--ckpt", mlp, "--device", "host")
	if r.code != 2 || !strings.Contains(r.stderr, "is a --model mlp checkpoint") {
		t.Errorf("solve of an MLP checkpoint: exit %d, stderr %q", r.code, r.stderr)
	}
}
