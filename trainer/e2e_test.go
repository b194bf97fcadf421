package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
)

// binDir holds the trainer binary built once by TestMain.
var binDir string

// TestMain builds the trainer once, or, when GPUKIT_BIN is set (the GPU
// machine, which has no Go toolchain), uses $GPUKIT_BIN/trainer.
func TestMain(m *testing.M) {
	if bin := os.Getenv("GPUKIT_BIN"); bin != "" {
		binDir = bin
		code := m.Run()
		hrmCleanup()
		os.Exit(code)
	}
	dir, err := os.MkdirTemp("", "trainer-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "trainer"), ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building trainer: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	hrmCleanup()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireData fails (not skips) without Fashion-MNIST: `make deps` installs
// it; GPUKIT_DATA_DIR names another directory (as on the GPU machine).
func requireData(t *testing.T) string {
	t.Helper()
	dir := data.DefaultDir
	if d := os.Getenv("GPUKIT_DATA_DIR"); d != "" {
		dir = d
	}
	if _, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte.gz")); err != nil {
		t.Fatalf("Fashion-MNIST is not installed in %s (make deps, or set GPUKIT_DATA_DIR): %v", dir, err)
	}
	return dir
}

type result struct {
	stdout, stderr string
	code           int
}

func trainer(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "trainer"), args...)
	var so, se bytes.Buffer
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

func mustOK(t *testing.T, r result) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
}

// line is one JSON line of trainer run, without the timing fields (which
// differ between runs).
type line struct {
	Step         int      `json:"step"`
	Epoch        int      `json:"epoch"`
	Loss         *float32 `json:"loss"`
	LR           *float32 `json:"lr"`
	TestAccuracy *float64 `json:"test_accuracy"`
}

func (l line) String() string {
	b, _ := json.Marshal(l)
	return string(b)
}

func parseLines(t *testing.T, s string) []line {
	t.Helper()
	var out []line
	for _, text := range strings.Split(strings.TrimSpace(s), "\n") {
		if text == "" {
			continue
		}
		var l line
		if err := json.Unmarshal([]byte(text), &l); err != nil {
			t.Fatalf("not a JSON line: %q", text)
		}
		out = append(out, l)
	}
	return out
}

func losses(ls []line) []float32 {
	var out []float32
	for _, l := range ls {
		if l.Loss != nil {
			out = append(out, *l.Loss)
		}
	}
	return out
}

func mean(v []float32) float64 {
	s := 0.0
	for _, x := range v {
		s += float64(x)
	}
	return s / float64(len(v))
}

// TestRunLowersLossAndEvalAgrees trains 200 steps on a subset: the loss falls,
// the outputs are written, and eval of the checkpoint reproduces the
// run's own test accuracy exactly.
func TestRunLowersLossAndEvalAgrees(t *testing.T) {
	dir := requireData(t)
	out := t.TempDir()
	seed := strconv.FormatUint(rand.Uint64N(1000), 10)
	r := trainer(t, "run", "--data", dir, "--out", out, "--limit", "6400", "--batch", "32", "--epochs", "1", "--log-every", "10", "--seed", seed)
	mustOK(t, r)
	ls := parseLines(t, r.stdout)
	l := losses(ls)
	if len(l) != 20 {
		t.Fatalf("%d loss lines, want 20", len(l))
	}
	if first, last := mean(l[:3]), mean(l[len(l)-5:]); !(last < 0.8*first) {
		t.Fatalf("loss did not fall: first %.4f, last %.4f", first, last)
	}
	final := ls[len(ls)-1]
	if final.TestAccuracy == nil || final.Step != 200 || final.Epoch != 1 || *final.TestAccuracy < 0.5 {
		t.Fatalf("last line %v", final)
	}
	metrics, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil || string(metrics) != r.stdout {
		t.Fatalf("metrics.jsonl differs from stdout (%v)", err)
	}
	png, err := os.ReadFile(filepath.Join(out, "loss.png"))
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("loss.png is not a PNG (%v)", err)
	}
	// model.safetensors holds the model's tensors alone (what
	// bench/reference/mlp.py's module loads strictly); state.safetensors
	// also the optimizer's state.
	f, err := ckpt.ReadFile(filepath.Join(out, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["step"] != "200" || f.Tensors["fc2.weight"].Shape[0] != 10 || len(f.Tensors) != 6 {
		t.Fatalf("checkpoint metadata %v, tensors %v", f.Metadata, f.Names())
	}
	st, err := ckpt.ReadFile(filepath.Join(out, "state.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Metadata["step"] != "200" || st.Tensors["fc2.weight"].Shape[0] != 10 || st.Tensors["optim/fc0.weight.exp_avg"].End == 0 {
		t.Fatalf("state metadata %v, tensors %v", st.Metadata, st.Names())
	}

	e := trainer(t, "eval", "--ckpt", filepath.Join(out, "model.safetensors"), "--data", dir, "--batch", "32")
	mustOK(t, e)
	var ev struct {
		TestAccuracy float64 `json:"test_accuracy"`
	}
	if err := json.Unmarshal([]byte(e.stdout), &ev); err != nil {
		t.Fatalf("eval stdout %q", e.stdout)
	}
	if ev.TestAccuracy != *final.TestAccuracy {
		t.Fatalf("eval says %v, the run said %v", ev.TestAccuracy, *final.TestAccuracy)
	}
	if strings.Count(strings.TrimSpace(e.stderr), "\n") != 0 || !strings.Contains(e.stderr, "test accuracy") {
		t.Fatalf("eval stderr %q", e.stderr)
	}
}

// TestInitDeterministic: init writes the same bytes for the same seed and
// other weights for another.
func TestInitDeterministic(t *testing.T) {
	dir := t.TempDir()
	seed := rand.Uint64N(1 << 40)
	var files [3][]byte
	for i, s := range []uint64{seed, seed, seed + 1} {
		p := filepath.Join(dir, fmt.Sprintf("init%d.safetensors", i))
		mustOK(t, trainer(t, "init", "--out", p, "--widths", "784,64,10", "--seed", strconv.FormatUint(s, 10)))
		files[i], _ = os.ReadFile(p)
	}
	if !bytes.Equal(files[0], files[1]) {
		t.Fatal("same seed, different files")
	}
	a, err1 := ckpt.Decode(files[0])
	b, err2 := ckpt.Decode(files[2])
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	_, wa, _ := a.Bytes("fc0.weight")
	_, wb, _ := b.Bytes("fc0.weight")
	if bytes.Equal(wa, wb) || len(a.Tensors) != 4 {
		t.Fatalf("other seed, same weights (or %d tensors)", len(a.Tensors))
	}
}

// TestResumeEqualsUninterrupted: SIGTERM in the middle, --resume, and the
// loss lines and final weights are bitwise those of an uninterrupted run.
func TestResumeEqualsUninterrupted(t *testing.T) {
	resumeEqualsUninterrupted(t, requireData(t), "3200", "--device", "host")
}

// resumeEqualsUninterrupted trains on the first limit examples for two
// epochs twice: once whole, once stopped by SIGTERM after step 40 and
// continued with --resume; the lines and checkpoints must be identical.
func resumeEqualsUninterrupted(t *testing.T, dir, limit string, extra ...string) {
	t.Helper()
	resumeWith(t, dir, limit, nil, extra...)
}

// resumeWith is resumeEqualsUninterrupted with model flags, which the
// first runs take and the resumed one gets from the checkpoint.
func resumeWith(t *testing.T, dir, limit string, model []string, extra ...string) {
	t.Helper()
	seed := strconv.FormatUint(rand.Uint64N(1000), 10)
	args := func(out string) []string {
		a := append([]string{"run", "--data", dir, "--out", out, "--limit", limit, "--batch", "32", "--epochs", "2", "--log-every", "5", "--seed", seed}, model...)
		return append(a, extra...)
	}
	whole := t.TempDir()
	r := trainer(t, args(whole)...)
	mustOK(t, r)
	want := parseLines(t, r.stdout)

	split := t.TempDir()
	cmd := exec.Command(filepath.Join(binDir, "trainer"), args(split)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var first bytes.Buffer
	sc := bufio.NewScanner(stdout)
	signalled := false
	for sc.Scan() {
		first.Write(sc.Bytes())
		first.WriteByte('\n')
		var l line
		json.Unmarshal(sc.Bytes(), &l)
		if !signalled && l.Step >= 40 {
			cmd.Process.Signal(syscall.SIGTERM)
			signalled = true
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("interrupted run: %v: %s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted after step") {
		t.Fatalf("the run was not interrupted: %s", stderr.String())
	}
	// No --log-every: the resumed run keeps the run's own (5, not the default).
	r2 := trainer(t, append([]string{"run", "--resume", split, "--data", dir}, extra...)...)
	mustOK(t, r2)
	got := append(parseLines(t, first.String()), parseLines(t, r2.stdout)...)
	if len(got) != len(want) {
		t.Fatalf("%d lines after resume, %d uninterrupted", len(got), len(want))
	}
	for i := range want {
		if got[i].String() != want[i].String() {
			t.Fatalf("line %d: resumed %v, uninterrupted %v", i, got[i], want[i])
		}
	}
	// The model and the state (optimizer state, position, the run's
	// flags) of both runs are the same.
	for _, file := range []string{"model.safetensors", "state.safetensors"} {
		a, err1 := ckpt.ReadFile(filepath.Join(whole, file))
		b, err2 := ckpt.ReadFile(filepath.Join(split, file))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if !reflect.DeepEqual(a.Names(), b.Names()) || !reflect.DeepEqual(a.Metadata, b.Metadata) {
			t.Fatalf("%s differs: %v %v", file, a.Metadata, b.Metadata)
		}
		for _, n := range a.Names() {
			_, x, _ := a.Bytes(n)
			_, y, _ := b.Bytes(n)
			if !bytes.Equal(x, y) {
				t.Fatalf("%s: %s differs after resume", file, n)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	dir := requireData(t)
	// A data directory whose training images are truncated.
	bad := t.TempDir()
	for _, n := range []string{"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"} {
		os.Symlink(filepath.Join(dir, n), filepath.Join(bad, n))
	}
	raw, err := readGz(filepath.Join(dir, "train-images-idx3-ubyte.gz"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(bad, "train-images-idx3-ubyte"), raw[:len(raw)/3], 0o644)
	junk := filepath.Join(t.TempDir(), "junk.safetensors")
	os.WriteFile(junk, []byte("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":{\"dtype\":"), 0o644)
	out := filepath.Join(t.TempDir(), "out")
	cases := []struct {
		args []string
		code int
		say  string
	}{
		{[]string{"run", "--out", out, "--data", t.TempDir()}, 1, "not found"},
		{[]string{"run", "--out", out, "--data", bad}, 1, "train-images-idx3-ubyte"},
		{[]string{"run", "--data", dir}, 2, "--out"},
		{[]string{"run", "--out", out, "--lr", "0"}, 2, "--lr"},
		{[]string{"run", "--out", out, "--lr", "abc"}, 2, "lr"},
		{[]string{"run", "--out", out, "--act", "tanh"}, 2, "--act"},
		{[]string{"run", "--out", out, "--optim", "lbfgs"}, 2, "--optim"},
		{[]string{"run", "--out", out, "--widths", "784,x,10"}, 2, "--widths"},
		{[]string{"run", "--out", out, "--widths", "100,10", "--data", dir}, 2, "784 pixels"},
		{[]string{"run", "--out", out, "--batch", "0"}, 2, "--batch"},
		{[]string{"run", "--out", out, "--epochs", "0"}, 2, "--epochs"},
		{[]string{"run", "--out", out, "--model", "cnn"}, 2, "--model"},
		{[]string{"run", "--out", out, "--graph", "maybe"}, 2, "--graph"},
		{[]string{"run", "--out", out, "--precision", "fp8"}, 2, "--precision"},
		{[]string{"run", "--out", out, "--device", "tpu"}, 2, "--device"},
		{[]string{"run", "--out", out, "--no-such-flag"}, 2, "no-such-flag"},
		{[]string{"run", "--out", out, "--log-every", "0", "--data", dir}, 2, "--log-every"},
		{[]string{"run", "stray", "--out", out}, 2, `unexpected argument "stray"`},
		{[]string{"run", "--out", out, "--data", dir, "--pool", filepath.Join(t.TempDir(), "none.sock")}, 1, "--pool"},
		{[]string{"run", "--resume", t.TempDir()}, 1, "--resume"},
		{[]string{"run", "--out", out, "--data", dir, "--limit", "10"}, 2, "no batch"},
		{[]string{"run", "--out", out, "--data", dir, "--device", "cuda:99"}, 1, "no such GPU"},
		{[]string{"run", "--out", out, "--device", "gpu1"}, 2, "--device"},
		{[]string{"run", "--out", out, "--clip", "-1"}, 2, "--clip"},
		{[]string{"run", "--resume", t.TempDir(), "--clip", "1"}, 2, "--clip"},
		{[]string{"eval", "--ckpt", junk, "--data", dir}, 1, "junk.safetensors"},
		{[]string{"eval", "--ckpt", filepath.Join(t.TempDir(), "none.safetensors")}, 1, "none.safetensors"},
		{[]string{"eval"}, 2, "ckpt"},
		{[]string{"init", "--out", junk, "--widths", "0,1"}, 2, "--widths"},
		{[]string{"init", "--out", junk}, 1, "exists; pass --force"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"bench"}, 2, "not built yet"},
		{[]string{"serve", "--x"}, 2, "not built yet"},
	}
	for _, c := range cases {
		r := trainer(t, c.args...)
		lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
		if r.code != c.code || len(lines) != 1 || !strings.HasPrefix(lines[0], "trainer") || !strings.Contains(lines[0], c.say) || r.stdout != "" {
			t.Errorf("%v: exit %d (want %d), stdout %q, stderr %q (want one line with %q)", c.args, r.code, c.code, r.stdout, r.stderr, c.say)
		}
	}
}

func readGz(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(z)
}

// TestPipeline runs examples/pipelines/train-fashion.sh in short mode with
// freshly built gpupool and trainer binaries.
func TestPipeline(t *testing.T) {
	dir := requireData(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "gpupool"), ".")
	build.Dir = filepath.Join("..", "gpupool")
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("gpupool does not build yet: %v: %s", err, out)
	}
	if err := os.Link(filepath.Join(binDir, "trainer"), filepath.Join(bin, "trainer")); err != nil {
		b, _ := os.ReadFile(filepath.Join(binDir, "trainer"))
		os.WriteFile(filepath.Join(bin, "trainer"), b, 0o755)
	}
	out := t.TempDir()
	cmd := exec.Command("bash", filepath.Join("..", "examples", "pipelines", "train-fashion.sh"))
	cmd.Env = append(os.Environ(), "GPUKIT_BIN="+bin, "DATA="+dir, "OUT="+out, "EPOCHS=1", "LIMIT=3000", "MIN_ACCURACY=0.5", "TMPDIR="+t.TempDir())
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("pipeline: %v\nstderr:\n%s", err, se.String())
	}
	ls := parseLines(t, so.String())
	last := ls[len(ls)-1]
	if last.TestAccuracy == nil || *last.TestAccuracy < 0.5 {
		t.Fatalf("last line %v", last)
	}
	for _, f := range []string{"model.safetensors", "metrics.jsonl", "loss.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGPTPipeline runs examples/pipelines/gpt-opticks.sh in its short mode
// (30 steps on Newton's Opticks, on the host): the run's JSON lines carry a
// validation loss below the text's unigram entropy, the checkpoint and plot
// are written, and the generated text follows, starting with the prompt.
func TestGPTPipeline(t *testing.T) {
	bin := t.TempDir()
	if err := os.Link(filepath.Join(binDir, "trainer"), filepath.Join(bin, "trainer")); err != nil {
		b, _ := os.ReadFile(filepath.Join(binDir, "trainer"))
		os.WriteFile(filepath.Join(bin, "trainer"), b, 0o755)
	}
	out := filepath.Join(t.TempDir(), "run")
	cmd := exec.Command("bash", filepath.Join("..", "examples", "pipelines", "gpt-opticks.sh"))
	cmd.Env = append(os.Environ(), "GPUKIT_BIN="+bin, "OUT="+out, "STEPS=30", "TOKENS=40", "DEVICE=host", "TMPDIR="+t.TempDir())
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("pipeline: %v\nstderr:\n%s", err, se.String())
	}
	lines := strings.Split(strings.TrimRight(so.String(), "\n"), "\n")
	var val float64
	i := 0
	for ; i < len(lines) && strings.HasPrefix(lines[i], "{"); i++ {
		var l struct {
			ValLoss *float64 `json:"val_loss"`
		}
		if err := json.Unmarshal([]byte(lines[i]), &l); err != nil {
			t.Fatalf("line %q: %v", lines[i], err)
		}
		if l.ValLoss != nil {
			val = *l.ValLoss
		}
	}
	text := strings.Join(lines[i:], "\n")
	if !strings.HasPrefix(text, "Light ") || len([]rune(text)) < 40 {
		t.Fatalf("generated text %q", text)
	}
	if !(val > 0 && val < 3.1) { // the Opticks' unigram entropy is 3.10 nats
		t.Fatalf("validation loss %v", val)
	}
	for _, f := range []string{"model.safetensors", "metrics.jsonl", "loss.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(se.String(), "unigram entropy") {
		t.Fatalf("no summary on stderr:\n%s", se.String())
	}
}
