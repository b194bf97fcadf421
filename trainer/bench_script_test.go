package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gpukit/libgpu/data"
)

// TestScaleScriptCommands: bench/scale.sh's dry run (DRY_RUN=1) for 4 GPUs
// with every knob set prints the calls a 4-GPU machine would run — the
// strong runs at 1, 2 and 4 GPUs, the weak ones at 1 and 2 (at 4 the
// weak batch is the strong one), --shard-optimizer at 2 and 4, the traced
// runs, the collectives and PyTorch — with the knobs as the trainer's
// flags (it finds them in `trainer run --model gpt --help`), and every
// trainer command it prints runs on the CPU as it is (ranks as one
// process, a tiny model and 2 steps appended: later flags win): so the
// script's arguments are the trainer's, whatever a GPU call would show.
// Bad knobs stop it with exit 2 before anything runs.
func TestScaleScriptCommands(t *testing.T) {
	script, err := filepath.Abs("../bench/scale.sh")
	if err != nil {
		t.Fatal(err)
	}
	text := data.DefaultTextPath()
	env := append(os.Environ(), "GPUKIT_BIN="+binDir, "DRY_RUN=1", "GPUS=4", "LAST_BUCKET_MB=0.5", "COMM_PRIORITY=high",
		"GRAD_COMM=bf16", "BUCKET_MB=8", "TRAINER_FLAGS=--nccl-max-ctas 8")
	cmd := exec.Command("bash", script, text)
	cmd.Env = env
	var se strings.Builder
	cmd.Stderr = &se
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("DRY_RUN=1 bench/scale.sh: %v\n%s", err, se.String())
	}
	var trainers [][]string
	torch, coll := 0, 0
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !strings.HasPrefix(l, "+ ") {
			t.Fatalf("not a command line: %q", l)
		}
		args := strings.Fields(strings.ReplaceAll(l[2:], `\`, ""))
		switch {
		case slices.Contains(args, "torch.distributed.run"):
			torch++
		case strings.HasSuffix(strings.Join(args, " "), "allreduce.sh 4 256MiB"):
			coll++
		default:
			trainers = append(trainers, args)
		}
	}
	if torch != 3 || coll != 1 || len(trainers) != 10 {
		t.Fatalf("%d trainer commands, %d torchrun, %d collectives; want 10, 3, 1:\n%s", len(trainers), torch, coll, out)
	}
	sharded, traced := 0, 0
	ranks := map[string]int{}
	for _, args := range trainers {
		line := strings.Join(args, " ")
		for _, want := range []string{"--model gpt", "--bucket-mb 8", "--grad-comm bf16", "--last-bucket-mb 0.5", "--comm-priority high",
			"--nccl-max-ctas 8"} {
			if !strings.Contains(line, want) {
				t.Fatalf("%q lacks %s", line, want)
			}
		}
		if slices.Contains(args, "--shard-optimizer") {
			sharded++
		}
		if args[2] == filepath.Join(binDir, "tracer") {
			traced++
		}
		n := "1"
		if i := slices.Index(args, "--nproc"); i >= 0 {
			n = args[i+1]
		}
		ranks[n]++
		// The trainer's own arguments, as one process on the CPU.
		i := slices.Index(args, "run")
		if i < 0 || !strings.HasSuffix(args[i-1], "trainer") && args[i-1] != "--" {
			t.Fatalf("no trainer run in %q", line)
		}
		run := append(append([]string{"run"}, args[i+1:]...), "--layers", "1", "--heads", "2", "--d-model", "16", "--block", "8",
			"--batch", "2", "--steps", "2", "--eval-every", "2", "--eval-batches", "1", "--log-every", "1", "--device", "host",
			"--precision", "f32", "--out", filepath.Join(t.TempDir(), "run"))
		r := trainer(t, run...)
		mustOK(t, r)
		if len(parseLines(t, r.stdout)) != 3 {
			t.Fatalf("%v: stdout %q", run, r.stdout)
		}
		if sh := strings.Contains(r.stderr, "--shard-optimizer ignored"); sh != slices.Contains(args, "--shard-optimizer") {
			t.Fatalf("%v: stderr %q", run, r.stderr)
		}
	}
	if sharded != 3 || traced != 3 || ranks["1"] != 2 || ranks["2"] != 4 || ranks["4"] != 4 {
		t.Fatalf("%d sharded, %d traced, by ranks %v; want 3, 3, map[1:2 2:4 4:4]:\n%s", sharded, traced, ranks, out)
	}
	for _, bad := range []string{"DRY_RUN=yes", "COMM_PRIORITY=urgent", "NPROCS=1 two", "BATCH=0"} {
		cmd := exec.Command("bash", script, text)
		cmd.Env = append(env, bad)
		b, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || strings.Count(string(b), "\n") != 1 || strings.Contains(string(b), "+ ") {
			t.Errorf("%s: %v, output %q (want exit 2 and one line)", bad, err, b)
		}
	}
}
