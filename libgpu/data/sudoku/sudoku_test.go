package sudoku

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gpukit/libgpu/ops/opstest"
)

// requireTools fails (never skips) without qqwing and faketime: CI
// installs them with make deps, as the trainer's tests get Fashion-MNIST.
func requireTools(t *testing.T) {
	t.Helper()
	if _, err := Tools(); err != nil {
		t.Fatalf("%v: run make deps, or %s", err, Install)
	}
}

func newRand(t *testing.T) (*rand.Rand, uint64) {
	t.Helper()
	seed := opstest.TestSeed(t)
	return rand.New(rand.NewPCG(seed, 7)), seed
}

// randomGrid is a complete valid grid: Solve's first solution of the empty
// grid, under a random Transform.
func randomGrid(r *rand.Rand) Grid {
	g, _ := Solve(Grid{}, 1)
	return RandomTransform(r).Apply(g)
}

// carve blanks cells of sol in random order while the puzzle keeps a
// unique solution (qqwing's method): a minimal puzzle.
func carve(r *rand.Rand, sol Grid) Grid {
	p := sol
	for _, i := range r.Perm(Cells) {
		v := p[i]
		p[i] = 0
		if _, n := Solve(p, 2); n != 1 {
			p[i] = v
		}
	}
	return p
}

func TestGridParseAndCheck(t *testing.T) {
	r, _ := newRand(t)
	sol := randomGrid(r)
	if err := CheckSolution(Grid{}, sol); err != nil {
		t.Fatal(err)
	}
	p := carve(r, sol)
	g, err := ParseGrid(p.String())
	if err != nil || g != p {
		t.Fatalf("ParseGrid(String()) = %v, %v", g, err)
	}
	if g, err := ParseGrid(strings.ReplaceAll(p.String(), ".", "0")); err != nil || g != p {
		t.Fatalf("'0' blanks: %v, %v", g, err)
	}
	for _, bad := range []string{p.String()[:80], p.String() + "1", "x" + p.String()[1:]} {
		if _, err := ParseGrid(bad); !errors.Is(err, ErrFormat) {
			t.Errorf("ParseGrid(%q) = %v, want ErrFormat", bad, err)
		}
	}
	// A repeated digit in a row, a column, a box; apart, no error.
	for _, c := range []struct {
		a, b int
		ok   bool
	}{{0, 8, false}, {0, 72, false}, {0, 20, false}, {40, 30, false}, {0, 30, true}, {10, 80, true}} {
		var q Grid
		q[c.a], q[c.b] = 5, 5
		if err := q.Check(); (err == nil) != c.ok {
			t.Errorf("5 at cells %d and %d: %v", c.a, c.b, err)
		}
	}
	var big Grid
	big[3] = 10
	if err := big.Check(); !errors.Is(err, ErrInvalid) {
		t.Errorf("a cell holding 10: %v", err)
	}
	bad := sol
	bad[0], bad[1] = bad[1], bad[0]
	if err := CheckSolution(Grid{}, bad); !errors.Is(err, ErrInvalid) {
		t.Errorf("swapped cells: %v", err)
	}
	other := sol
	other[40] = 0
	if err := CheckSolution(p, other); !errors.Is(err, ErrInvalid) {
		t.Errorf("solution with a blank: %v", err)
	}
}

func TestSolve(t *testing.T) {
	r, _ := newRand(t)
	for range 20 {
		sol := randomGrid(r)
		p := carve(r, sol)
		got, n := Solve(p, 2)
		if n != 1 || got != sol {
			t.Fatalf("minimal puzzle %s: %d solutions, first %s, want 1: %s", p, n, got, sol)
		}
		if got, ok := Unique(sol); !ok || got != sol {
			t.Fatal("a full grid is not its own unique solution")
		}
		// Removing any further given of a minimal puzzle allows a second
		// solution; each found is valid and keeps the givens.
		i := slices.IndexFunc(p[:], func(v uint8) bool { return v != 0 })
		q := p
		q[i] = 0
		first, n := Solve(q, 3)
		if n < 2 {
			t.Fatalf("minimal %s less cell %d: %d solutions", p, i, n)
		}
		if err := CheckSolution(q, first); err != nil {
			t.Fatal(err)
		}
		// A contradiction has none.
		c := p
		j := slices.IndexFunc(c[:], func(v uint8) bool { return v == 0 })
		c[j] = sol[(j/9)*9+(j%9+1)%9] // the digit of its row neighbour
		if _, n := Solve(c, 2); n != 0 {
			t.Fatalf("%s has a digit twice in a row: %d solutions", c, n)
		}
	}
	if _, n := Solve(Grid{}, 5); n != 5 {
		t.Fatalf("empty grid, limit 5: %d", n)
	}
}

func TestTransformKeepsValidity(t *testing.T) {
	r, _ := newRand(t)
	for range 50 {
		sol := randomGrid(r)
		p := carve(r, sol)
		f := Fingerprint(p, sol)
		for range 20 {
			tr := RandomTransform(r)
			ap, as := tr.Apply(p), tr.Apply(sol)
			if err := CheckSolution(ap, as); err != nil {
				t.Fatalf("transform %+v: %v", tr, err)
			}
			if got, ok := Unique(ap); !ok || got != as {
				t.Fatalf("transform %+v: the puzzle's unique solution is not the transformed one", tr)
			}
			if ap.Givens() != p.Givens() {
				t.Fatalf("transform changed the givens: %d, %d", ap.Givens(), p.Givens())
			}
			if Fingerprint(ap, as) != f {
				t.Fatalf("transform %+v changed the fingerprint of %s", tr, p)
			}
		}
		if id := Identity(); id.Apply(p) != p {
			t.Fatal("Identity changed a puzzle")
		}
	}
}

// TestTransformApply: each part of a transform does what
// shuffle_sudoku's does: transpose first, then output (r, c) takes input
// (Rows[r], Cols[c]), then the digits are relabelled.
func TestTransformApply(t *testing.T) {
	r, _ := newRand(t)
	g := randomGrid(r)
	tr := Identity()
	tr.Transpose = true
	out := tr.Apply(g)
	for i := range out {
		if out[i] != g[(i%9)*9+i/9] {
			t.Fatalf("transpose: cell %d is %d, want %d", i, out[i], g[(i%9)*9+i/9])
		}
	}
	full := RandomTransform(r)
	out = full.Apply(g)
	for i := range out {
		sr, sc := int(full.Rows[i/9]), int(full.Cols[i%9])
		if full.Transpose {
			sr, sc = sc, sr
		}
		if out[i] != full.Digits[g[sr*9+sc]] {
			t.Fatalf("transform %+v: cell %d", full, i)
		}
	}
	tr = Identity()
	tr.Digits[1], tr.Digits[2] = 2, 1
	out = tr.Apply(g)
	for i := range out {
		want := g[i]
		switch want {
		case 1:
			want = 2
		case 2:
			want = 1
		}
		if out[i] != want {
			t.Fatalf("relabel 1<->2: cell %d is %d, want %d", i, out[i], want)
		}
	}
}

// TestTransformDraws: RandomTransform reaches every row, column and digit
// permutation position and both transpose values, as shuffle_sudoku does.
func TestTransformDraws(t *testing.T) {
	r, _ := newRand(t)
	var rows, cols, digits [9][9]int
	transposed := 0
	const n = 20000
	for range n {
		tr := RandomTransform(r)
		for i := range 9 {
			rows[i][tr.Rows[i]]++
			cols[i][tr.Cols[i]]++
			digits[i][tr.Digits[i+1]-1]++
			if int(tr.Rows[i])/3 != int(tr.Rows[i/3*3])/3 {
				t.Fatalf("rows %v leave a band", tr.Rows)
			}
		}
		if tr.Transpose {
			transposed++
		}
	}
	// Each cell of each table is Binomial(n, 1/9): mean 2222, sd 44; 600 is 13 sd.
	for i := range 9 {
		for j := range 9 {
			for _, c := range []int{rows[i][j], cols[i][j], digits[i][j]} {
				if c < n/9-600 || c > n/9+600 {
					t.Fatalf("a position was drawn %d times in %d, want about %d", c, n, n/9)
				}
			}
		}
	}
	if transposed < n/2-1000 || transposed > n/2+1000 {
		t.Fatalf("transposed %d of %d", transposed, n)
	}
}

func TestAugmenter(t *testing.T) {
	r, seed := newRand(t)
	a := Augmenter{Seed: seed, NumAug: 1000}
	if a.Transform(3, 0) != Identity() {
		t.Fatal("copy 0 is not the puzzle")
	}
	if again := (Augmenter{Seed: seed, NumAug: 1000}); a.Transform(3, 7) != again.Transform(3, 7) {
		t.Fatal("a copy is not reproducible")
	}
	if a.Transform(3, 7) == a.Transform(3, 8) || a.Transform(3, 7) == a.Transform(4, 7) {
		t.Fatal("two copies share a transform")
	}
	b := Augmenter{Seed: seed + 1, NumAug: 1000}
	if a.Transform(3, 7) == b.Transform(3, 7) {
		t.Fatal("the seed does not change the copies")
	}
	sol := randomGrid(r)
	p := carve(r, sol)
	for k := range 30 {
		tr := a.Transform(0, k)
		if err := CheckSolution(tr.Apply(p), tr.Apply(sol)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFingerprintSeparates: distinct random puzzles get distinct
// fingerprints, and so does a puzzle with one more given.
func TestFingerprintSeparates(t *testing.T) {
	r, _ := newRand(t)
	seen := map[uint64]string{}
	for range 300 {
		sol := randomGrid(r)
		p := carve(r, sol)
		f := Fingerprint(p, sol)
		if s, ok := seen[f]; ok {
			t.Fatalf("%s and %s share fingerprint %x", s, p, f)
		}
		seen[f] = p.String()
		q2 := p
		i := slices.IndexFunc(q2[:], func(v uint8) bool { return v == 0 })
		q2[i] = sol[i]
		if Fingerprint(q2, sol) == f {
			t.Fatalf("%s with cell %d given has the same fingerprint", p, i)
		}
	}
}

func TestCSVRoundTrip(t *testing.T) {
	r, _ := newRand(t)
	var rows []CSVRow
	for i := range 25 {
		sol := randomGrid(r)
		rows = append(rows, CSVRow{Source: []string{"puzzles0_kaggle", "puzzles2_17_clue", `with "quote", comma`}[i%3], Input: carve(r, sol), Label: sol, Rating: r.IntN(200)})
	}
	var b bytes.Buffer
	if err := WriteCSV(&b, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "source,question,answer,rating\n") {
		t.Fatalf("header: %q", b.String()[:40])
	}
	var got []CSVRow
	err := ReadCSV(bytes.NewReader(b.Bytes()), func(line int, row CSVRow) error {
		if line != len(got)+2 {
			t.Errorf("row %d reported at line %d", len(got), line)
		}
		got = append(got, row)
		return nil
	})
	if err != nil || !slices.Equal(got, rows) {
		t.Fatalf("round trip: %v; %d rows back of %d", err, len(got), len(rows))
	}
	// '0' blanks as well as '.'.
	zero := strings.Replace(b.String(), rows[0].Input.String(), strings.ReplaceAll(rows[0].Input.String(), ".", "0"), 1)
	got = got[:0]
	if err := ReadCSV(strings.NewReader(zero), func(_ int, row CSVRow) error { got = append(got, row); return nil }); err != nil || got[0] != rows[0] {
		t.Fatalf("'0' blanks: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	wrong := rows[1].Label
	wrong[0], wrong[1] = wrong[1], wrong[0]
	for _, c := range []struct {
		name, text, want string
	}{
		{"empty", "", "empty CSV"},
		{"header", "a,b,c,d\n" + lines[1], "CSV header"},
		{"short question", lines[0] + "\nx,123,456,0\n", "line 2: question"},
		{"rating", lines[0] + "\n" + strings.TrimSuffix(lines[1], ","+strings.Split(lines[1], ",")[3]) + ",hard\n", "line 2: sudoku: bad format: rating"},
		{"answer", lines[0] + "\n" + lines[1] + "\ns," + rows[1].Input.String() + "," + wrong.String() + ",1\n", "line 3: solution"},
		{"fields", lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\na,b\n", "line 4"},
	} {
		err := ReadCSV(strings.NewReader(c.text), func(int, CSVRow) error { return nil })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// csvOf is rows as a Sudoku-Extreme CSV file.
func csvOf(t *testing.T, rows []CSVRow) []byte {
	var b bytes.Buffer
	if err := WriteCSV(&b, rows); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestSampleCSV(t *testing.T) {
	r, seed := newRand(t)
	var rows []CSVRow
	for range 60 {
		sol := randomGrid(r)
		rows = append(rows, CSVRow{Source: "t", Input: carve(r, sol), Label: sol})
	}
	// Ten transformed copies: the sample keeps one of each family.
	for i := range 10 {
		tr := RandomTransform(r)
		rows = append(rows, CSVRow{Source: "copy", Input: tr.Apply(rows[i].Input), Label: tr.Apply(rows[i].Label)})
	}
	file := csvOf(t, rows)
	a, st, err := SampleCSV(bytes.NewReader(file), 60, seed, nil)
	if err != nil || st.Rows != 70 || len(a) != 60 || st.Duplicates != 10 {
		t.Fatalf("60 of 70 rows with 10 copies: %d puzzles, %+v, %v", len(a), st, err)
	}
	fp := map[uint64]bool{}
	for _, p := range a {
		fp[Fingerprint(p.Input, p.Label)] = true
	}
	if len(fp) != 60 {
		t.Fatalf("%d distinct fingerprints in 60", len(fp))
	}
	b, _, _ := SampleCSV(bytes.NewReader(file), 60, seed, nil)
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different sample")
	}
	c, _, _ := SampleCSV(bytes.NewReader(file), 20, seed+1, nil)
	d, _, _ := SampleCSV(bytes.NewReader(file), 20, seed, nil)
	if slices.Equal(c, d) {
		t.Fatal("the seed does not change the sample")
	}
	if _, _, err := SampleCSV(bytes.NewReader(file), 61, seed, nil); err == nil || !strings.Contains(err.Error(), "60 distinct") {
		t.Fatalf("61 of 60 distinct: %v", err)
	}
	// A question with two solutions is refused.
	two := rows[0]
	two.Input[slices.IndexFunc(two.Input[:], func(v uint8) bool { return v != 0 })] = 0
	if _, _, err := SampleCSV(bytes.NewReader(csvOf(t, []CSVRow{two})), 1, seed, nil); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("non-unique question: %v", err)
	}
}

func TestSetSaveLoad(t *testing.T) {
	r, _ := newRand(t)
	s := &Set{Meta: map[string]string{"source": "test", "split": "train"}}
	for range 7 {
		sol := randomGrid(r)
		s.Inputs = append(s.Inputs, carve(r, sol))
		s.Labels = append(s.Labels, sol)
	}
	path := filepath.Join(t.TempDir(), "train.safetensors")
	if err := Save(path, s); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Inputs, s.Inputs) || !slices.Equal(got.Labels, s.Labels) ||
		got.Meta["format"] != Format || got.Meta["count"] != "7" || got.Meta["source"] != "test" {
		t.Fatalf("loaded %d puzzles, meta %v", got.Len(), got.Meta)
	}
	bad := &Set{Inputs: s.Inputs, Labels: slices.Clone(s.Labels)}
	bad.Labels[3][0], bad.Labels[3][1] = bad.Labels[3][1], bad.Labels[3][0]
	if err := Save(path, bad); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "puzzle 3") {
		t.Fatalf("saving a wrong label: %v", err)
	}
	// Disjoint catches a transformed copy.
	tr := RandomTransform(r)
	other := &Set{Inputs: []Grid{tr.Apply(s.Inputs[5])}, Labels: []Grid{tr.Apply(s.Labels[5])}}
	if err := Disjoint(s, other); !errors.Is(err, ErrOverlap) {
		t.Fatalf("Disjoint missed a transformed copy: %v", err)
	}
	if err := Disjoint(&Set{Inputs: s.Inputs[:5], Labels: s.Labels[:5]}, &Set{Inputs: s.Inputs[5:], Labels: s.Labels[5:]}); err != nil {
		t.Fatal(err)
	}
}

func TestSampler(t *testing.T) {
	_, seed := newRand(t)
	for _, c := range []struct{ n, batch int }{{10, 4}, {7, 16}, {12, 12}} {
		s := Sampler{N: c.n, Batch: c.batch, Seed: seed, Aug: Augmenter{Seed: seed, NumAug: 5}}
		var visits []int
		copies := map[int]int{}
		for step := range 3 * c.n {
			p, k := s.Draw(step)
			if len(p) != c.batch {
				t.Fatalf("step %d: %d rows", step, len(p))
			}
			p2, k2 := s.Draw(step)
			if !slices.Equal(p, p2) || !slices.Equal(k, k2) {
				t.Fatalf("step %d drawn twice differs", step)
			}
			visits = append(visits, p...)
			for _, x := range k {
				copies[x]++
			}
		}
		// Every epoch (n consecutive visits) is a permutation.
		for e := 0; (e+1)*c.n <= len(visits); e++ {
			ep := slices.Clone(visits[e*c.n : (e+1)*c.n])
			slices.Sort(ep)
			for i, v := range ep {
				if v != i {
					t.Fatalf("n %d batch %d: epoch %d visits %v", c.n, c.batch, e, visits[e*c.n:(e+1)*c.n])
				}
			}
		}
		if len(copies) != 6 {
			t.Fatalf("copies drawn: %v, want 0..5", copies)
		}
	}
	a := Sampler{N: 50, Batch: 8, Seed: seed}
	b := Sampler{N: 50, Batch: 8, Seed: seed + 1}
	if pa, _ := a.Draw(0); slices.Equal(pa, func() []int { p, _ := b.Draw(0); return p }()) {
		t.Fatal("the seed does not change the batches")
	}
}

func TestMinHaltSteps(t *testing.T) {
	_, seed := newRand(t)
	const n = 100000
	var explored int
	seen := map[int32]bool{}
	for step := range 10 {
		m := MinHaltSteps(seed, step, n/10, 0.1, 16)
		if !slices.Equal(m, MinHaltSteps(seed, step, n/10, 0.1, 16)) {
			t.Fatal("not reproducible")
		}
		for _, v := range m {
			if v != 0 && (v < 2 || v > 16) {
				t.Fatalf("draw %d outside 0 or [2, 16]", v)
			}
			if v != 0 {
				explored++
				seen[v] = true
			}
		}
	}
	// Binomial(1e5, 0.1): sd 95; 1000 is over 10 sd.
	if explored < n/10-1000 || explored > n/10+1000 || len(seen) != 15 {
		t.Fatalf("%d of %d rows explore, values %v", explored, n, seen)
	}
}

func TestReplay(t *testing.T) {
	r, seed := newRand(t)
	set := &Set{Meta: map[string]string{"source": "test"}}
	for range 9 {
		sol := randomGrid(r)
		set.Inputs = append(set.Inputs, carve(r, sol))
		set.Labels = append(set.Labels, sol)
	}
	s := Sampler{N: 9, Batch: 4, Seed: seed, Aug: Augmenter{Seed: seed, NumAug: 1000}}
	rp, err := NewReplay(set, ReplayConfig{Sampler: s, Steps: 5, Prob: 0.5, MaxSteps: 16})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "replay.safetensors")
	if err := rp.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := LoadReplay(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Steps != 5 || got.Batch != 4 || !slices.Equal(got.Inputs, rp.Inputs) || !slices.Equal(got.Labels, rp.Labels) ||
		!slices.Equal(got.MinHaltSteps, rp.MinHaltSteps) || !slices.Equal(got.Puzzles, rp.Puzzles) || !slices.Equal(got.Copies, rp.Copies) ||
		got.Meta["halt_max_steps"] != "16" || got.Meta["num_aug"] != "1000" {
		t.Fatalf("replay round trip differs: %+v", got.Meta)
	}
	// Each row is its puzzle's copy, and a valid puzzle with its solution.
	for i := range rp.Inputs {
		tr := s.Aug.Transform(int(rp.Puzzles[i]), int(rp.Copies[i]))
		if rp.Inputs[i] != tr.Apply(set.Inputs[rp.Puzzles[i]]) {
			t.Fatalf("row %d is not copy %d of puzzle %d", i, rp.Copies[i], rp.Puzzles[i])
		}
		if sol, ok := Unique(rp.Inputs[i]); !ok || sol != rp.Labels[i] {
			t.Fatalf("row %d: augmented puzzle lost its unique solution", i)
		}
	}
	if _, err := NewReplay(set, ReplayConfig{Sampler: s, Steps: 5, Prob: 0.1, MaxSteps: 1}); err == nil {
		t.Fatal("halt max steps 1 accepted")
	}
}

func TestGenerate(t *testing.T) {
	requireTools(t)
	_, seed := newRand(t)
	ctx := context.Background()
	printed := 0
	a, st, err := Generate(ctx, GenConfig{Count: 12, Difficulty: "expert", Seed: seed, Progress: func(n int) { printed = n }})
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 12 || st.Printed < 12 || printed < 12 || !strings.HasPrefix(st.Version, "qqwing ") {
		t.Fatalf("%d puzzles, %+v, progress %d", len(a), st, printed)
	}
	fp := map[uint64]bool{}
	for _, p := range a {
		if sol, ok := Unique(p.Input); !ok || sol != p.Label {
			t.Fatalf("%s: not unique, or not the printed solution", p.Input)
		}
		fp[Fingerprint(p.Input, p.Label)] = true
	}
	if len(fp) != 12 {
		t.Fatalf("%d distinct in 12", len(fp))
	}
	b, _, err := Generate(ctx, GenConfig{Count: 12, Difficulty: "expert", Seed: seed, Jobs: 1})
	if err != nil || !slices.Equal(a, b) {
		t.Fatalf("same seed, different puzzles (%v)", err)
	}
	c, _, err := Generate(ctx, GenConfig{Count: 12, Difficulty: "expert", Seed: seed + 1})
	if err != nil || slices.Equal(a, c) {
		t.Fatalf("the seed does not change the puzzles (%v)", err)
	}
	if _, _, err := Generate(ctx, GenConfig{Count: 1, Difficulty: "hard", Seed: seed}); err == nil || !strings.Contains(err.Error(), "expert") {
		t.Fatalf("difficulty hard: %v", err)
	}
}

// TestGenerateShards: several shards give the same puzzles whatever the
// number of processes at once ("any" is qqwing's fastest difficulty).
func TestGenerateShards(t *testing.T) {
	requireTools(t)
	_, seed := newRand(t)
	ctx := context.Background()
	n := 2*ShardSize + 3
	a, st, err := Generate(ctx, GenConfig{Count: n, Difficulty: "any", Seed: seed, Jobs: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != n || st.Shards < 3 {
		t.Fatalf("%d puzzles from %d shards", len(a), st.Shards)
	}
	b, _, err := Generate(ctx, GenConfig{Count: n, Difficulty: "any", Seed: seed, Jobs: 1})
	if err != nil || !slices.Equal(a, b) {
		t.Fatalf("3 processes and 1 differ (%v)", err)
	}
	// A cancelled run stops its processes and says so.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := Generate(cctx, GenConfig{Count: 5, Difficulty: "expert", Seed: seed}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestBuild(t *testing.T) {
	requireTools(t)
	_, seed := newRand(t)
	train, test, st, err := Build(context.Background(), BuildConfig{Train: 10, Test: 6, Seed: seed, Difficulty: "expert"})
	if err != nil {
		t.Fatal(err)
	}
	if train.Len() != 10 || test.Len() != 6 || st.Read < 16 || !strings.HasPrefix(st.Source, "qqwing") {
		t.Fatalf("train %d, test %d, %+v", train.Len(), test.Len(), st)
	}
	if err := Disjoint(train, test); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Set{train, test} {
		for i := range s.Inputs {
			if sol, ok := Unique(s.Inputs[i]); !ok || sol != s.Labels[i] {
				t.Fatalf("%s puzzle %d: not unique", s.Meta["split"], i)
			}
		}
	}
	if train.Meta["split"] != "train" || test.Meta["split"] != "test" || test.Meta["difficulty"] != "expert" || test.Meta["source"] != st.Source {
		t.Fatalf("meta %v / %v", train.Meta, test.Meta)
	}
	// The same seed splits the same way.
	train2, test2, _, err := Build(context.Background(), BuildConfig{Train: 10, Test: 6, Seed: seed, Difficulty: "expert"})
	if err != nil || !slices.Equal(train.Inputs, train2.Inputs) || !slices.Equal(test.Inputs, test2.Inputs) {
		t.Fatalf("not reproducible (%v)", err)
	}
}

func TestBuildCSV(t *testing.T) {
	r, seed := newRand(t)
	var rows []CSVRow
	for range 30 {
		sol := randomGrid(r)
		rows = append(rows, CSVRow{Source: "t", Input: carve(r, sol), Label: sol, Rating: 3})
	}
	path := filepath.Join(t.TempDir(), "train.csv")
	if err := os.WriteFile(path, csvOf(t, rows), 0o644); err != nil {
		t.Fatal(err)
	}
	train, test, st, err := Build(context.Background(), BuildConfig{Train: 20, Test: 8, Seed: seed, CSV: path})
	if err != nil {
		t.Fatal(err)
	}
	if train.Len() != 20 || test.Len() != 8 || st.Read != 30 || st.Source != "csv:"+path || train.Meta["difficulty"] != "" {
		t.Fatalf("train %d test %d %+v %v", train.Len(), test.Len(), st, train.Meta)
	}
	if err := Disjoint(train, test); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := Build(context.Background(), BuildConfig{Train: 1, Seed: seed, CSV: path + ".missing"}); err == nil {
		t.Fatal("a missing CSV file passed")
	}
}

func TestToolsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := exec.LookPath("qqwing"); err == nil {
		t.Fatal("qqwing still found")
	}
	_, _, err := Generate(context.Background(), GenConfig{Count: 1, Difficulty: "expert"})
	if !errors.Is(err, ErrTools) || !strings.Contains(err.Error(), "apt-get install qqwing faketime") {
		t.Fatalf("without qqwing: %v", err)
	}
}
