package train

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
)

// lmHostRun trains a tiny GPT on the host through RunLM (dropout and
// clipping on) and returns its stdout lines without the timing fields and
// its checkpoint's tensors.
func lmHostRun(t *testing.T, corpus *data.Corpus, o LMOptions) ([]string, map[string][]byte) {
	t.Helper()
	cfg := DefaultLM()
	cfg.Model.Layers, cfg.Model.Heads, cfg.Model.DModel, cfg.Model.Block, cfg.Model.Dropout = 2, 2, 16, 8, 0.1
	cfg.Batch, cfg.Steps, cfg.Warmup, cfg.DecaySteps, cfg.EvalEvery, cfg.EvalBatches, cfg.Seed = 4, 12, 2, 12, 6, 2, 5
	var out bytes.Buffer
	o.Alloc, o.Corpus, o.Out, o.LogEvery, o.Stdout, o.Precision = host(), corpus, t.TempDir(), 1, &out, ops.PrecF32
	if _, err := RunLM(context.Background(), cfg, o); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		lines = append(lines, stripTimes(l))
	}
	f, err := ckpt.ReadFile(filepath.Join(o.Out, ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string][]byte{}
	for name := range f.Tensors {
		_, b, err := f.Bytes(name)
		if err != nil {
			t.Fatal(err)
		}
		ts[name] = b
	}
	return lines, ts
}

// stripTimes drops the fields of a JSON line that depend on the clock.
func stripTimes(l string) string {
	var kept []string
	for _, f := range strings.Split(strings.Trim(l, "{}"), ",") {
		switch strings.SplitN(f, ":", 2)[0] {
		case `"tokens_per_s"`, `"step_ms"`, `"mfu"`, `"elapsed_s"`:
			continue
		}
		kept = append(kept, f)
	}
	return strings.Join(kept, ",")
}

func testCorpus(t *testing.T) *data.Corpus {
	t.Helper()
	c, err := data.LoadText(data.DefaultTextPath(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLMBucketGradsSameRun: a run whose gradients live in bucket buffers,
// marked ready by the tape's hook into the reducer of a one-rank (Solo)
// communicator, trains bitwise as the run with the model's own gradients
// (losses, gradient norms, validation losses, every tensor of the
// checkpoint), with dropout and clipping on and buckets small enough that
// the model spans several.
func TestLMBucketGradsSameRun(t *testing.T) {
	corpus := testCorpus(t)
	want, wantT := lmHostRun(t, corpus, LMOptions{})
	got, gotT := lmHostRun(t, corpus, LMOptions{buckets: true, BucketBytes: 4 << 10})
	if len(want) != 12+2 || len(got) != len(want) {
		t.Fatalf("%d and %d lines", len(want), len(got))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("line %d: %s with bucket gradients, %s without", i+1, got[i], want[i])
		}
	}
	if len(gotT) != len(wantT) {
		t.Fatalf("%d tensors in the checkpoint, want %d", len(gotT), len(wantT))
	}
	for name, b := range wantT {
		if !bytes.Equal(gotT[name], b) {
			t.Fatalf("checkpoint tensor %s differs", name)
		}
	}
	// The layout did make several buckets.
	cfg := DefaultLM()
	cfg.Model.Layers, cfg.Model.Heads, cfg.Model.DModel, cfg.Model.Block, cfg.Model.Vocab = 2, 2, 16, 8, corpus.Tok.Vocab()
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := newLMWith(e, device.Local{Dev: h}, "", cfg, ops.PrecF32, true, "",
		&dpConfig{comm: nccl.Solo(h), bucket: bucketConfig(4 << 10)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.free()
	if n := len(l.dp.layout.Buckets); n < 3 {
		t.Fatalf("%d buckets", n)
	}
}

// TestLMWorldChecks: a batch that does not divide by the world size, and
// a world of several ranks on the host, fail with one line each before
// anything is written.
func TestLMWorldChecks(t *testing.T) {
	corpus := testCorpus(t)
	cfg := DefaultLM()
	cfg.Batch = 5
	w := dist.World{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, Nodes: 1, MasterAddr: "127.0.0.1", MasterPort: 1, RendezvousPort: 1}
	out := t.TempDir()
	o := LMOptions{Alloc: host(), Corpus: corpus, Out: out, LogEvery: 1, Stdout: &bytes.Buffer{}, World: w}
	_, err := RunLM(context.Background(), cfg, o)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--batch 5 does not divide by the world size 2") {
		t.Fatalf("batch 5 over 2 ranks: %v", err)
	}
	cfg.Batch = 4
	w.Rank = 0
	o.World = w
	_, err = RunLM(context.Background(), cfg, o)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "GPU") {
		t.Fatalf("2 ranks on the host: %v", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Fatalf("a refused run wrote %d files", len(ents))
	}
}
