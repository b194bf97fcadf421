package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gpukit/tracer/internal/chrome"
)

var pipelineBins struct {
	once sync.Once
	err  error
	out  []byte
}

// buildPipelineBins adds gpupool and trainer to binDir (tracer is there).
func buildPipelineBins(t *testing.T) {
	t.Helper()
	pipelineBins.once.Do(func() {
		for _, tool := range []string{"gpupool", "trainer"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, tool), ".")
			cmd.Dir = filepath.Join("..", tool)
			if out, err := cmd.CombinedOutput(); err != nil {
				pipelineBins.err, pipelineBins.out = err, out
				return
			}
		}
	})
	if pipelineBins.err != nil {
		t.Fatalf("building gpupool and trainer: %v\n%s", pipelineBins.err, pipelineBins.out)
	}
}

// TestTracedPipeline runs examples/pipelines/train-fashion-traced.sh in
// short mode and checks the trace it writes.
func TestTracedPipeline(t *testing.T) {
	if _, err := os.Stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"); err != nil {
		t.Fatalf("Fashion-MNIST is not installed (make deps): %v", err)
	}
	buildPipelineBins(t)
	dir := t.TempDir()
	tracePath := filepath.Join(dir, "trace.json")
	cmd := exec.Command("bash", filepath.Join("..", "examples", "pipelines", "train-fashion-traced.sh"))
	cmd.Env = append(os.Environ(), "GPUKIT_BIN="+binDir, "OUT="+filepath.Join(dir, "run"), "TRACE="+tracePath,
		"EPOCHS=1", "LIMIT=2000", "TMPDIR="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, want := range []string{"tracer: wrote", "check: valid", "test accuracy"} {
		if !strings.Contains(stderr.String(), want) {
			t.Fatalf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	tr, err := chrome.ReadFile(tracePath)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := tr.Validate()
	if err != nil {
		t.Fatal(err)
	}
	var record bool
	for _, e := range tr.Events {
		record = record || (e.Ph == "X" && e.Cat == "tracer" && e.Name == "record")
	}
	if !record {
		t.Fatal("no record span of tracer itself")
	}
	// tracer, gpupool and trainer: the trainer's pool requests (ipc spans)
	// and the daemon's handling of them (pool spans) joined by flows.
	if sum.Processes < 3 || sum.LinkedProcesses < 2 || sum.CrossFlows == 0 {
		t.Fatalf("%+v: want spans of the pool and the trainer linked by flows", sum)
	}
	names := map[string]bool{}
	for _, e := range tr.Events {
		if e.Ph == "X" {
			names[e.Cat+"/"+e.Name] = true
		}
	}
	for _, want := range []string{"trainer/step", "trainer/data", "trainer/forward", "trainer/backward",
		"trainer/optimizer", "trainer/checkpoint", "trainer/evaluate", "pool/alloc", "ipc/alloc"} {
		if !names[want] {
			t.Errorf("no span %s in the trace", want)
		}
	}
	t.Logf("%+v", sum)
}
