package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/ckpt"
)

// tinyShape are the flags of a GPT that trains in milliseconds a step on
// the host (tinyGPT: and on the host).
var (
	tinyShape = []string{"--model", "gpt", "--layers", "1", "--heads", "2", "--d-model", "16", "--block", "8", "--batch", "2", "--eval-batches", "1"}
	tinyGPT   = append([]string{"--device", "host"}, tinyShape...)
)

// oneLine requires r to have failed with status code and one line on
// stderr containing say, and nothing on stdout.
func oneLine(t *testing.T, what string, r result, code int, say string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if r.code != code || len(lines) != 1 || !strings.HasPrefix(lines[0], "trainer") || !strings.Contains(lines[0], say) || r.stdout != "" {
		t.Errorf("%s: exit %d (want %d), stdout %q, stderr %q (want one line with %q)", what, r.code, code, r.stdout, r.stderr, say)
	}
}

// TestFlagsOfTheModel: each model's run and init take the driver's flags
// and its own; another model's flag is refused in one line with exit 2
// before anything is written; --help lists the model's flags and no
// other model's, with its --data, its lines and its defaults.
func TestFlagsOfTheModel(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	for _, c := range []struct {
		args []string
		say  string
	}{
		{[]string{"run", "--model", "mlp", "--steps", "3"}, "--steps is not a flag of --model mlp but of --model gpt, --model hrm, --model moe, --model unet"},
		{[]string{"run", "--epochs", "2", "--model", "gpt"}, "--epochs is not a flag of --model gpt but of --model mlp"},
		{[]string{"run", "--model", "unet", "--optim", "sgd"}, "--optim is not a flag of --model unet"},
		{[]string{"init", "--model", "gpt", "--widths", "784,10"}, "--widths is not a flag of --model gpt"},
		{[]string{"run", "--model", "gpt", "--experts", "4"}, "--experts is not a flag of --model gpt but of --model moe"},
		{[]string{"init", "--model", "gpt", "--aux-loss", "0"}, "--aux-loss is not a flag of --model gpt but of --model moe"},
		{[]string{"run", "--model", "moe", "--epochs", "2"}, "--epochs is not a flag of --model moe but of --model mlp"},
		{[]string{"run", "--model", "moe", "--ema-decay", "0.9"}, "--ema-decay is not a flag of --model moe but of --model unet"},
		{[]string{"run", "--model", "foo"}, `--model "foo": want one of gpt, hrm, mlp, moe, unet`},
		{[]string{"init", "--model", "foo", "--out", out}, `--model "foo": want one of gpt, hrm, mlp, moe, unet`},
		{[]string{"run", "--model", "hrm", "--layers", "2"}, "--layers is not a flag of --model hrm but of --model gpt, --model moe"},
	} {
		oneLine(t, strings.Join(c.args, " "), trainer(t, append(c.args, "--out", out)...), 2, c.say)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("a refused run made its --out")
	}
	for _, c := range []struct {
		model      string
		has, lacks []string
	}{
		{"mlp", []string{"--widths", "--epochs", "--optim", "Fashion-MNIST", "test_accuracy", "samples_per_s"},
			[]string{"--steps", "--layers", "--channels", "--bucket-mb", "--shard-optimizer", "--nccl-max-ctas", "tokens_per_s"}},
		{"gpt", []string{"--layers", "--steps", "--eval-every", "--bucket-mb", "--grad-comm", "--shard-optimizer", "--last-bucket-mb",
			"--comm-priority", "--nccl-min-ctas", "--nccl-max-ctas", "UTF-8 text", "tokens_per_s", "val_loss"},
			[]string{"--widths", "--epochs", "--channels", "--ema-decay", "Fashion-MNIST IDX", "samples_per_s", "--experts", "--z-loss", "aux_loss"}},
		{"moe", []string{"--layers", "--steps", "--eval-every", "--bucket-mb", "--grad-comm", "--shard-optimizer", "UTF-8 text", "tokens_per_s", "val_loss",
			"--experts value", "--top-k value", "--moe-every value", "--expert-width value", "--aux-loss value", "--z-loss value",
			"aux_loss and z_loss", "--layers value            transformer blocks (default: 6)", "(default: 384)", "--experts value           expert MLPs of each MoE layer (default: 8)"},
			[]string{"--widths", "--epochs", "--channels", "--ema-decay", "Fashion-MNIST IDX", "samples_per_s"}},
		{"unet", []string{"--channels", "--ema-decay", "--ema-warmup", "--publish-every", "images_per_s"},
			[]string{"--widths", "--layers", "--optim", "--momentum", "--bucket-mb", "--shard-optimizer", "--comm-priority", "tokens_per_s", "--halt-max-steps"}},
		{"hrm", []string{"--halt-max-steps", "--h-cycles", "--puzzle-emb-lr", "--num-aug", "trainer data sudoku", "sequences_per_s",
			"test_exact_accuracy", "q_halt_loss"},
			[]string{"--widths", "--epochs", "--layers", "--channels", "--optim", "--bucket-mb", "--shard-optimizer", "tokens_per_s", "Fashion-MNIST IDX"}},
	} {
		r := trainer(t, "run", "--model", c.model, "--help")
		mustOK(t, r)
		for _, s := range c.has {
			if !strings.Contains(r.stdout, s) {
				t.Errorf("run --model %s --help does not mention %s", c.model, s)
			}
		}
		for _, s := range c.lacks {
			if strings.Contains(r.stdout, s) {
				t.Errorf("run --model %s --help mentions %s", c.model, s)
			}
		}
		if d := regexp.MustCompile(`--model value .*\(default: "([a-z]+)"\)`).FindStringSubmatch(r.stdout); d == nil || d[1] != c.model {
			t.Errorf("run --model %s --help: --model's default is %v", c.model, d)
		}
	}
}

// TestHelpTexts: every command's help, for every model, is honest: one
// default per flag, placeholders that are not prose, every model in
// `trainer --help`, generate's --seed and --graph about sampling.
func TestHelpTexts(t *testing.T) {
	root := trainer(t, "--help")
	mustOK(t, root)
	for _, m := range []string{"mlp", "gpt", "moe", "unet", "hrm"} {
		if !strings.Contains(root.stdout, m+" (") {
			t.Errorf("trainer --help does not name --model %s", m)
		}
	}
	dir := t.TempDir()
	gptCkpt := filepath.Join(dir, "gpt.safetensors")
	mustOK(t, trainer(t, append([]string{"init", "--out", gptCkpt}, tinyShape...)...))
	var helps []string
	for _, args := range [][]string{
		{"run"}, {"run", "--model", "gpt"}, {"run", "--model", "unet"}, {"init", "--model", "gpt"}, {"init", "--model", "unet"},
		{"eval"}, {"eval", "--ckpt", gptCkpt}, {"generate"}, {"info"}, {"launch"}, {"run", "--model", "moe"}, {"init", "--model", "moe"},
		{"run", "--model", "hrm"}, {"init", "--model", "hrm"}, {"solve"}, {"data", "sudoku"}, {"data", "replay"},
	} {
		r := trainer(t, append(args, "--help")...)
		mustOK(t, r)
		helps = append(helps, r.stdout)
		_, opts, _ := strings.Cut(r.stdout, "OPTIONS:")
		for _, l := range strings.Split(opts, "\n") {
			if strings.Count(l, "(default") > 1 {
				t.Errorf("%v --help: two defaults in %q", args, l)
			}
			if m := regexp.MustCompile(`^\s+--[a-z-]+ ([a-z]+ [a-z]+)`).FindStringSubmatch(l); m != nil {
				t.Errorf("%v --help: the placeholder of %q reads %q", args, l, m[1])
			}
			if strings.Contains(l, "the only model") {
				t.Errorf("%v --help: %q", args, l)
			}
		}
	}
	gen := helps[7]
	for _, l := range strings.Split(gen, "\n") {
		switch {
		case strings.Contains(l, "--seed") && !strings.Contains(l, "sampling"):
			t.Errorf("generate --help: %q", l)
		case strings.Contains(l, "--graph") && (strings.Contains(l, "training") || !strings.Contains(l, "decode")):
			t.Errorf("generate --help: %q", l)
		}
	}
	if !strings.Contains(helps[6], "--eval-batches") || strings.Contains(helps[6], "--act") {
		t.Errorf("eval --ckpt GPT --help lists the MLP's flags, or not the GPT's:\n%s", helps[6])
	}
}

// TestExitCodes: bad flag values of eval, init and generate exit 2 with one
// line, before any work; runtime failures exit 1.
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	mlp := filepath.Join(dir, "mlp.safetensors")
	mustOK(t, trainer(t, "init", "--out", mlp, "--widths", "784,8,10"))
	gpt := filepath.Join(dir, "gpt.safetensors")
	mustOK(t, trainer(t, append([]string{"init", "--out", gpt}, tinyShape...)...))
	unet := filepath.Join(dir, "unet.safetensors")
	mustOK(t, trainer(t, "init", "--model", "unet", "--out", unet, "--channels", "8,8,16", "--groups", "4", "--heads", "2"))
	for _, c := range []struct {
		args []string
		code int
		say  string
	}{
		{[]string{"eval", "--ckpt", mlp, "--batch", "-5"}, 2, "--batch -5"},
		{[]string{"eval", "--ckpt", mlp, "--act", "tanh"}, 2, "--act"},
		{[]string{"eval", "--ckpt", gpt, "--eval-batches", "0"}, 2, "--eval-batches 0"},
		{[]string{"eval", "--ckpt", unet}, 2, "is a --model unet checkpoint"},
		{[]string{"eval", "--ckpt", gpt, "--data", filepath.Join(dir, "none.txt")}, 1, "none.txt"},
		{[]string{"generate", "--ckpt", gpt, "--temperature", "0"}, 2, "--temperature 0"},
		{[]string{"generate", "--ckpt", gpt, "--top-k", "-1"}, 2, "--top-k -1"},
		{[]string{"generate", "--ckpt", mlp}, 2, "is a --model mlp checkpoint"},
		{[]string{"generate", "--ckpt", filepath.Join(dir, "none.safetensors")}, 1, "none.safetensors"},
		{[]string{"run", "--model", "gpt", "--out", filepath.Join(dir, "r"), "--warmup", "-1"}, 2, "--warmup -1"},
		{[]string{"run", "--model", "gpt", "--out", filepath.Join(dir, "r"), "--data", dir}, 1, "is a directory"},
		{[]string{"run", "--model", "unet", "--out", filepath.Join(dir, "r"), "--publish-every", "5"}, 2, "--publish-every needs --pool"},
		{[]string{"run", "--model", "unet", "--out", filepath.Join(dir, "r"), "--ema-decay", "2"}, 2, "--ema-decay 2"},
		{[]string{"run", "--model", "moe", "--out", filepath.Join(dir, "r"), "--experts", "0"}, 2, "--experts 0"},
		{[]string{"run", "--model", "moe", "--out", filepath.Join(dir, "r"), "--top-k", "3", "--experts", "2"}, 2, "--top-k 3"},
		{[]string{"run", "--model", "moe", "--out", filepath.Join(dir, "r"), "--moe-every", "7"}, 2, "--moe-every 7 with 6 layers"},
		{[]string{"run", "--model", "moe", "--out", filepath.Join(dir, "r"), "--aux-loss", "-1"}, 2, "--aux-loss -1"},
		{[]string{"run", "--model", "moe", "--out", filepath.Join(dir, "r"), "--expert-width", "-4"}, 2, "--expert-width -4"},
	} {
		oneLine(t, strings.Join(c.args, " "), trainer(t, c.args...), c.code, c.say)
	}
	if _, err := os.Stat(filepath.Join(dir, "r")); err == nil {
		t.Fatal("a refused run made its --out")
	}
}

// TestResumeKeepsFlags: a GPT and a U-Net run resumed without --log-every
// and --precision keep theirs (the state file says so), and --resume of a
// run directory that holds no state says so in one line without
// suggesting a --resume that cannot work.
func TestResumeKeepsFlags(t *testing.T) {
	dir := requireData(t)
	for _, c := range []struct {
		name        string
		first, more []string
		want        []int // the steps of the resumed run's loss lines
	}{
		{"gpt", append(append([]string{}, tinyGPT...), "--steps", "4", "--eval-every", "4"), []string{"--steps", "8"}, []int{6, 8}},
		{"unet", []string{"--model", "unet", "--device", "host", "--data", dir, "--limit", "64", "--batch", "4", "--channels", "8,8,16",
			"--groups", "4", "--heads", "2", "--steps", "4"}, []string{"--steps", "8"}, []int{6, 8}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := t.TempDir()
			mustOK(t, trainer(t, append([]string{"run", "--out", out, "--log-every", "2", "--precision", "bf16"}, c.first...)...))
			r := trainer(t, append([]string{"run", "--resume", out}, c.more...)...)
			mustOK(t, r)
			var steps []int
			for _, l := range parseLines(t, r.stdout) {
				if l.Loss != nil {
					steps = append(steps, l.Step)
				}
			}
			if !slicesEqual(steps, c.want) {
				t.Fatalf("resumed run logged the losses of steps %v, want %v (--log-every 2 kept)", steps, c.want)
			}
			st, err := ckpt.ReadFile(filepath.Join(out, "state.safetensors"))
			if err != nil || !strings.Contains(st.Metadata["run"], `"precision":"bf16"`) || !strings.Contains(st.Metadata["run"], `"log_every":2`) {
				t.Fatalf("state's run settings %q (%v)", st.Metadata["run"], err)
			}
		})
	}
	// A directory with lines but no checkpoint: refused, and no --resume
	// suggested; one with a checkpoint: --resume suggested.
	noState := t.TempDir()
	os.WriteFile(filepath.Join(noState, "metrics.jsonl"), []byte(`{"step":1,"loss":2}`+"\n"), 0o644)
	r := trainer(t, append([]string{"run", "--out", noState, "--steps", "2"}, tinyGPT...)...)
	oneLine(t, "run into a directory without state", r, 1, "already holds metrics.jsonl; pass --force to replace it")
	if strings.Contains(r.stderr, "--resume") {
		t.Errorf("suggests a --resume that cannot work: %s", r.stderr)
	}
	oneLine(t, "resume without state", trainer(t, "run", "--resume", noState), 1, "holds no run (no state.safetensors)")
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestProgressBar: with GPUKIT_PROGRESS=always the run draws a bar with a
// rate and an ETA on stderr; stdout keeps only the JSON lines, the same as
// metrics.jsonl.
func TestProgressBar(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(binDir, "trainer"), append([]string{"run", "--out", out, "--steps", "30", "--log-every", "10"}, tinyGPT...)...)
	cmd.Env = append(os.Environ(), "GPUKIT_PROGRESS=always")
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %s", err, se.String())
	}
	if !strings.Contains(se.String(), "steps/s") || !regexp.MustCompile(`\[[0-9hms]+:[0-9hms]+\]`).MatchString(se.String()) ||
		!strings.Contains(se.String(), "train step 30/30") {
		t.Fatalf("no progress bar with a rate and an ETA on stderr:\n%q", se.String())
	}
	m, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if so.String() != string(m) {
		t.Fatalf("stdout differs from metrics.jsonl:\n%s", so.String())
	}
	for _, l := range strings.Split(strings.TrimSpace(so.String()), "\n") {
		if !json.Valid([]byte(l)) {
			t.Fatalf("stdout line %q is not JSON", l)
		}
	}
}

// TestGPTBestCheckpoint: a GPT run keeps best.safetensors, the model at
// its lowest validation loss (metadata val_loss, step), beside the last
// model.safetensors; both hold the state dict alone (nanoGPT's names), the
// state file adds the optimizer. eval and generate given the run
// directory read best.safetensors and say so.
func TestGPTBestCheckpoint(t *testing.T) {
	out := t.TempDir()
	r := trainer(t, append([]string{"run", "--out", out, "--steps", "30", "--eval-every", "5", "--log-every", "5", "--lr", "0.01"}, tinyGPT...)...)
	mustOK(t, r)
	best, bestStep := math.Inf(1), 0
	for _, text := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var l struct {
			Step    int      `json:"step"`
			ValLoss *float64 `json:"val_loss"`
		}
		json.Unmarshal([]byte(text), &l)
		if l.ValLoss != nil && *l.ValLoss < best {
			best, bestStep = *l.ValLoss, l.Step
		}
	}
	f, err := ckpt.ReadFile(filepath.Join(out, "best.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	json.Unmarshal([]byte(f.Metadata["val_loss"]), &v)
	if math.Abs(v-best) > 5e-5 || f.Metadata["step"] != itoa(bestStep) {
		t.Fatalf("best.safetensors: val_loss %s at step %s; the run's lowest %v at step %d", f.Metadata["val_loss"], f.Metadata["step"], best, bestStep)
	}
	for _, file := range []string{"best.safetensors", "model.safetensors"} {
		g, err := ckpt.ReadFile(filepath.Join(out, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range g.Names() {
			if !strings.HasPrefix(n, "transformer.") && n != "lm_head.weight" {
				t.Fatalf("%s holds %s, not a name of nanoGPT's state dict", file, n)
			}
		}
	}
	st, err := ckpt.ReadFile(filepath.Join(out, "state.safetensors"))
	if err != nil || st.Tensors["optim/transformer.wte.weight.exp_avg"].End == 0 {
		t.Fatalf("state.safetensors: %v", err)
	}
	e := trainer(t, "eval", "--ckpt", out)
	mustOK(t, e)
	var ev struct {
		ValLoss float64 `json:"val_loss"`
		Ckpt    string  `json:"ckpt"`
	}
	json.Unmarshal([]byte(e.stdout), &ev)
	if ev.Ckpt != filepath.Join(out, "best.safetensors") || math.Abs(ev.ValLoss-best) > 2e-4 || !strings.Contains(e.stderr, "eval reads "+ev.Ckpt) {
		t.Fatalf("eval --ckpt DIR: %s %s", e.stdout, e.stderr)
	}
	g := trainer(t, "generate", "--ckpt", out, "--tokens", "5", "--prompt", "The")
	mustOK(t, g)
	if !strings.HasPrefix(g.stdout, "The") || !strings.Contains(g.stderr, "generate reads "+ev.Ckpt) {
		t.Fatalf("generate --ckpt DIR: %q %q", g.stdout, g.stderr)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// TestKillDuringCheckpoint: SIGKILL while the trainer writes a checkpoint
// (the moment its temporary state file appears, seen through inotify)
// leaves a .state.safetensors.tmp* file and lines logged after the last
// checkpoint; --resume removes the file, cuts metrics.jsonl back to the
// checkpoint, and the run ends with each step's lines once, those of an
// uninterrupted run.
func TestKillDuringCheckpoint(t *testing.T) {
	// A GPT big enough that writing its state (about 40 MB) takes a while.
	model := []string{"--model", "gpt", "--device", "host", "--layers", "4", "--heads", "4", "--d-model", "256", "--block", "16",
		"--batch", "2", "--eval-batches", "1", "--steps", "6", "--eval-every", "1", "--log-every", "1"}
	wholeOut := t.TempDir()
	whole := trainer(t, append([]string{"run", "--out", wholeOut}, model...)...)
	mustOK(t, whole)
	want := stripAll(t, whole.stdout)

	out := t.TempDir()
	caught := false
	for attempt := 0; attempt < 5 && !caught; attempt++ {
		os.RemoveAll(out)
		os.Mkdir(out, 0o755)
		caught = killMidWrite(t, out, model, 2)
	}
	if !caught {
		t.Fatal("five runs renamed their state file before SIGKILL reached them: no write was cut short")
	}
	litter, _ := filepath.Glob(filepath.Join(out, ".state.safetensors.tmp*"))
	if len(litter) == 0 {
		t.Fatal("no temporary file after the kill")
	}
	r := trainer(t, "run", "--resume", out)
	mustOK(t, r)
	if left, _ := filepath.Glob(filepath.Join(out, ".*.tmp*")); len(left) != 0 {
		t.Fatalf("the resumed run left %v", left)
	}
	m, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if got := stripAll(t, string(m)); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("metrics.jsonl after kill -9 and resume:\n%s\nuninterrupted:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// killMidWrite runs the trainer into out and sends it SIGKILL as soon as
// the n-th temporary state file appears; it reports whether the kill cut
// a write short (the temporary file is still there).
func killMidWrite(t *testing.T, out string, args []string, n int) bool {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, out, unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "trainer"), append([]string{"run", "--out", out}, args...)...)
	var se bytes.Buffer
	cmd.Stderr = &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	seen := 0
	buf := make([]byte, 64<<10)
	deadline := time.Now().Add(2 * time.Minute)
	for seen < n {
		select {
		case err := <-exited:
			t.Fatalf("the trainer exited before its checkpoint %d: %v: %s", n, err, se.String())
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no checkpoint %d in two minutes: %s", n, se.String())
		}
		// Wait for events a tenth of a second at a time, so an exit is seen.
		if k, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 100); err != nil && err != unix.EINTR {
			t.Fatal(err)
		} else if k <= 0 {
			continue
		}
		k, err := unix.Read(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= k; {
			ev := (*unix.InotifyEvent)(unsafePointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if strings.HasPrefix(name, ".state.safetensors.tmp") {
				if seen++; seen == n {
					cmd.Process.Signal(syscall.SIGKILL)
					break
				}
			}
		}
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("the killed trainer did not exit")
	}
	litter, _ := filepath.Glob(filepath.Join(out, ".state.safetensors.tmp*"))
	return len(litter) > 0
}

// stripAll is the JSON lines of s without their clock-dependent fields.
func stripAll(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %q", sc.Text())
		}
		for _, k := range []string{"tokens_per_s", "step_ms", "elapsed_s", "mfu"} {
			delete(m, k)
		}
		b, _ := json.Marshal(m)
		out = append(out, string(b))
	}
	return out
}
