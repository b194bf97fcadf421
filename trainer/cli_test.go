package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/cli/clitest"
)

// TestScripts runs testdata/script/*.txtar with the trainer TestMain built
// first in PATH (status, jsonlines: libgpu/cli/clitest).
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:  "testdata/script",
		Cmds: clitest.Cmds(),
		Setup: func(e *testscript.Env) error {
			e.Setenv("PATH", binDir+string(os.PathListSeparator)+e.Getenv("PATH"))
			e.Setenv("GPUKIT_TRACE", "")
			return nil
		},
	})
}

// TestOutNotReplaced: run refuses an --out that holds a run, --force
// replaces it, --resume continues it; a run shorter than --log-every
// still writes a plot.
func TestOutNotReplaced(t *testing.T) {
	dir := requireData(t)
	out := t.TempDir() // exists and is empty, as from mktemp -d
	args := []string{"run", "--data", dir, "--out", out, "--limit", "320", "--batch", "32", "--epochs", "1", "--log-every", "100", "--device", "host"}
	r := trainer(t, args...)
	mustOK(t, r)
	if ls := losses(parseLines(t, r.stdout)); len(ls) != 0 {
		t.Fatalf("%d loss lines in 10 steps with --log-every 100", len(ls))
	}
	if _, err := os.Stat(filepath.Join(out, "loss.png")); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	r = trainer(t, args...)
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "already holds model.safetensors, metrics.jsonl; pass --force to replace it") ||
		strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("second run into %s: exit %d, stdout %q, stderr %q", out, r.code, r.stdout, r.stderr)
	}
	if after, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl")); !bytes.Equal(before, after) {
		t.Fatal("the refused run changed metrics.jsonl")
	}
	mustOK(t, trainer(t, append(args, "--force")...))
	r = trainer(t, "run", "--resume", out, "--data", dir, "--epochs", "2", "--device", "host")
	mustOK(t, r)
	if ls := parseLines(t, r.stdout); len(ls) != 1 || ls[0].Step != 20 || ls[0].TestAccuracy == nil {
		t.Fatalf("resumed run printed %v, want the accuracy after step 20 only (--log-every 100 kept)", ls)
	}
}

// TestSIGTERMDuringStartup: SIGTERM while the trainer is still loading
// its data ends the run after one step with a checkpoint and exit 0, not
// exit 143 with nothing written. The training images come through a FIFO,
// so the trainer is known to be loading when the signal is sent.
func TestSIGTERMDuringStartup(t *testing.T) {
	dir := requireData(t)
	fifoDir := t.TempDir()
	for _, n := range []string{"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"} {
		if err := os.Symlink(filepath.Join(dir, n), filepath.Join(fifoDir, n)); err != nil {
			t.Fatal(err)
		}
	}
	fifo := filepath.Join(fifoDir, "train-images-idx3-ubyte.gz")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	images, err := os.ReadFile(filepath.Join(dir, "train-images-idx3-ubyte.gz"))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(binDir, "trainer"), "run", "--data", fifoDir, "--out", out, "--limit", "320",
		"--batch", "32", "--epochs", "1", "--log-every", "1", "--device", "host")
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Opening a FIFO for writing without blocking succeeds once a reader
	// has it open: then the trainer is loading.
	var w *os.File
	for deadline := time.Now().Add(time.Minute); w == nil; {
		f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		switch {
		case err == nil:
			w = f
		case !errors.Is(err, syscall.ENXIO):
			t.Fatal(err)
		case time.Now().After(deadline):
			t.Fatal("the trainer never opened its training images")
		default:
			select {
			case err := <-exited:
				t.Fatalf("the trainer exited before loading: %v: %s", err, se.String())
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Back to blocking writes, then the images.
	if err := syscall.SetNonblock(int(w.Fd()), false); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(images); err != nil {
		t.Fatalf("writing the images: %v (stderr %s)", err, se.String())
	}
	w.Close()
	if err := <-exited; err != nil {
		t.Fatalf("trainer after an early SIGTERM: %v: %s", err, se.String())
	}
	if !strings.Contains(se.String(), "interrupted after step 1;") {
		t.Fatalf("stderr %q", se.String())
	}
	f, err := ckpt.ReadFile(filepath.Join(out, "model.safetensors"))
	if err != nil || f.Metadata["step"] != "1" {
		t.Fatalf("checkpoint: %v, metadata %v", err, f)
	}
}
