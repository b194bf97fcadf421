package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// counter is the model of the driver's tests, on the host: its one weight
// w adds each step's input (the step number, 1-based, times rate), and
// the step's loss is w, so every loss depends on the whole history and a
// resumed run logs the same losses only if its state came back whole.
// Its evaluations return val[step] (NaN when absent: no validation loss).
type counter struct {
	steps, evalEvery, saveEvery int
	rate                        float32
	val                         map[int]float64
	nanAt                       int           // the loss is NaN from this step (0: never)
	onFill                      func(int)     // called in Fill (a signal during a step)
	onEval                      func(int)     // called in Eval
	evals                       []int         // the steps evaluated
	evalWait                    chan struct{} // Eval waits on it or for ctx (nil: returns at once)
}

func (c *counter) Config() any                               { return map[string]any{"steps": c.steps, "rate": c.rate} }
func (c *counter) Steps() int                                { return c.steps }
func (c *counter) Load(dist.World) error                     { return nil }
func (c *counter) Init(device.Allocator) (Checkpoint, error) { return Checkpoint{}, nil }
func (c *counter) Summary(r Result, model string) string {
	return fmt.Sprintf("%d steps; wrote %s", r.Step, model)
}

func (c *counter) Build(env *Env) (Trainer, error) {
	a := env.Alloc
	t := &counterTrainer{c: c, e: env.Engine}
	var err error
	for _, p := range []**tensor.Tensor{&t.x, &t.w, &t.loss} {
		if *p, err = tensor.Alloc(a, "", tensor.F32, 1); err != nil {
			return nil, err
		}
		if err := (*p).WriteF32([]float32{0}); err != nil {
			return nil, err
		}
	}
	return t, nil
}

type counterTrainer struct {
	c          *counter
	e          *ops.Engine
	x, w, loss *tensor.Tensor
}

func (t *counterTrainer) Describe() string         { return "counter" }
func (t *counterTrainer) Inputs() []*tensor.Tensor { return []*tensor.Tensor{t.x} }
func (t *counterTrainer) Capturable() bool         { return true }
func (t *counterTrainer) LR(int) float32           { return 0.5 }
func (t *counterTrainer) Free()                    {}

func (t *counterTrainer) Fill(step int, in [][]byte) error {
	v := float32(step+1) * t.c.rate
	if t.c.nanAt > 0 && step+1 >= t.c.nanAt {
		v = float32(math.NaN())
	}
	tensor.BytesAs[float32](in[0])[0] = v
	if t.c.onFill != nil {
		t.c.onFill(step)
	}
	return nil
}

func (t *counterTrainer) Compute(gt *trace.GPUTimer) error {
	return RunPhases(gt, []NamedPhase{{SpanForward, func() error {
		if err := t.e.Add(t.w, t.w, t.x); err != nil {
			return err
		}
		return t.e.Scale(t.loss, t.w, 1, false)
	}}})
}

func (t *counterTrainer) Metrics() Metrics {
	return Metrics{Loss: t.loss, Unit: "samples", Items: 1, LogFinal: true, LossName: "count"}
}

func (t *counterTrainer) Checkpoint(int) (Checkpoint, error) {
	m, err := Entries("", []ckpt.Named{{Name: "w", T: t.w}})
	return Checkpoint{Model: m, Meta: map[string]string{"kind": "counter"}}, err
}

func (t *counterTrainer) Load(f *ckpt.File) error { return f.Load("w", t.w) }

func (t *counterTrainer) EvalEvery() int { return t.c.evalEvery }

func (t *counterTrainer) Eval(ctx context.Context, step int, _ time.Duration) (Eval, error) {
	if t.c.onEval != nil {
		t.c.onEval(step)
	}
	if t.c.evalWait != nil {
		select {
		case <-t.c.evalWait:
		case <-ctx.Done():
			return Eval{}, ctx.Err()
		}
	}
	t.c.evals = append(t.c.evals, step)
	v, ok := t.c.val[step]
	if !ok {
		v = math.NaN()
	}
	f := []Field{{"score", float64(step)}}
	if ok {
		f = append(f, Field{"val_loss", v})
	}
	return Eval{Fields: f, ValLoss: v}, nil
}

func (t *counterTrainer) SaveEvery() int { return t.c.saveEvery }

// runCounter runs c into out (resuming when resume) and returns its stdout
// lines and the result.
func runCounter(t *testing.T, ctx context.Context, c *counter, out string, resume bool) ([]string, Result, error) {
	t.Helper()
	var stdout bytes.Buffer
	o := Options{Model: "counter", Alloc: device.Local{Dev: device.NewHost()}, Out: out, LogEvery: 1, Stdout: &stdout,
		Settings: Settings{LogEvery: 1}}
	if resume {
		r, err := ReadResume(out)
		if err != nil {
			t.Fatal(err)
		}
		o.Resume = r
	}
	res, err := Run(ctx, c, o)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if l != "" {
			lines = append(lines, stripTimes(l))
		}
	}
	return lines, res, err
}

// stripTimes drops a line's clock-dependent fields.
func stripTimes(l string) string {
	var m map[string]any
	if json.Unmarshal([]byte(l), &m) != nil {
		return l
	}
	delete(m, "samples_per_s")
	delete(m, "step_ms")
	b, _ := json.Marshal(m)
	return string(b)
}

func metricsLines(t *testing.T, out string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		lines = append(lines, stripTimes(l))
	}
	return lines
}

// TestRunResumeAfterSignal: a run whose context is cancelled during step
// 4 stops after it with a checkpoint, and the resumed run's lines (and
// metrics.jsonl, and the final state) are those of an uninterrupted run;
// a checkpoint every 3 steps and the evaluations' lines are in place.
func TestRunResumeAfterSignal(t *testing.T) {
	mk := func() *counter { return &counter{steps: 8, evalEvery: 4, saveEvery: 3, rate: 1.5} }
	whole := t.TempDir()
	want, _, err := runCounter(t, context.Background(), mk(), whole, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 8+2 {
		t.Fatalf("%d lines, want 8 loss lines and 2 evaluations:\n%s", len(want), strings.Join(want, "\n"))
	}
	split := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	c := mk()
	c.onFill = func(step int) {
		if step == 5 { // step 6 of 8: after the checkpoint of step 3, before that of step 6
			cancel()
		}
	}
	first, res, err := runCounter(t, ctx, c, split, false)
	if err != nil || !res.Interrupted || res.Step != 6 {
		t.Fatalf("interrupted run: %+v, %v", res, err)
	}
	second, res, err := runCounter(t, context.Background(), mk(), split, true)
	if err != nil || res.Interrupted || res.Step != 8 {
		t.Fatalf("resumed run: %+v, %v", res, err)
	}
	got := append(first, second...)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("interrupted and resumed:\n%s\nuninterrupted:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if m := metricsLines(t, split); strings.Join(m, "\n") != strings.Join(want, "\n") {
		t.Fatalf("metrics.jsonl after resume:\n%s", strings.Join(m, "\n"))
	}
	for _, dir := range []string{whole, split} {
		f, err := ckpt.ReadFile(filepath.Join(dir, ModelFile))
		if err != nil {
			t.Fatal(err)
		}
		_, b, _ := f.Bytes("w")
		if w := tensor.BytesAs[float32](b)[0]; w != 1.5*36 || f.Metadata[MetaStep] != "8" || f.Metadata["kind"] != "counter" {
			t.Fatalf("%s: w %v, metadata %v", dir, w, f.Metadata)
		}
	}
}

// TestRunSignalInLastStep: a signal during the last step ends the run
// without the evaluation due there: the checkpoint says it is pending,
// and the resumed run runs it first, then finishes (no step left).
func TestRunSignalInLastStep(t *testing.T) {
	out := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	c := &counter{steps: 4, evalEvery: 10, rate: 1, onFill: func(step int) {
		if step == 3 {
			cancel()
		}
	}}
	_, res, err := runCounter(t, ctx, c, out, false)
	if err != nil || !res.Interrupted || res.Step != 4 || len(c.evals) != 0 {
		t.Fatalf("signal in the last step: %+v, %v; evaluations at %v (want none)", res, err, c.evals)
	}
	r, err := ReadResume(out)
	if err != nil || !r.Pending || r.Stored.Step != 4 {
		t.Fatalf("state: pending %v, step %d, %v", r.Pending, r.Stored.Step, err)
	}
	c2 := &counter{steps: 4, evalEvery: 10, rate: 1}
	lines, res, err := runCounter(t, context.Background(), c2, out, true)
	if err != nil || res.Interrupted || !res.Trained || len(c2.evals) != 1 || c2.evals[0] != 4 || len(lines) != 1 {
		t.Fatalf("resumed: %+v, %v; evaluations %v; lines %v", res, err, c2.evals, lines)
	}
	if r, err := ReadResume(out); err != nil || r.Pending {
		t.Fatalf("after the evaluation the state is still pending (%v)", err)
	}
}

// TestRunSignalDuringEval: a signal while an evaluation runs stops it
// (a process alone), and the run ends with that evaluation pending.
func TestRunSignalDuringEval(t *testing.T) {
	out := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	c := &counter{steps: 6, evalEvery: 3, rate: 1, evalWait: make(chan struct{})}
	c.onEval = func(int) { cancel() }
	_, res, err := runCounter(t, ctx, c, out, false)
	if err != nil || !res.Interrupted || res.Step != 3 || len(c.evals) != 0 {
		t.Fatalf("%+v, %v, evaluations %v", res, err, c.evals)
	}
	if r, err := ReadResume(out); err != nil || !r.Pending || r.Stored.Step != 3 {
		t.Fatalf("state after an interrupted evaluation: %+v, %v", r, err)
	}
}

// TestRunBestCheckpoint: best.safetensors is the model at the evaluation
// of the lowest validation loss so far, across a resume, with val_loss in
// its metadata; a model without validation losses writes none.
func TestRunBestCheckpoint(t *testing.T) {
	val := map[int]float64{2: 3, 4: 1.5, 6: 2, 8: 1.25, 10: 1.75}
	out := t.TempDir()
	if _, _, err := runCounter(t, context.Background(), &counter{steps: 6, evalEvery: 2, rate: 1, val: val}, out, false); err != nil {
		t.Fatal(err)
	}
	best := func() (float32, string) {
		f, err := ckpt.ReadFile(filepath.Join(out, BestFile))
		if err != nil {
			t.Fatal(err)
		}
		_, b, _ := f.Bytes("w")
		if len(f.Tensors) != 1 || f.Metadata[MetaFormat] != FormatModel {
			t.Fatalf("best.safetensors: %v %v", f.Names(), f.Metadata)
		}
		return tensor.BytesAs[float32](b)[0], f.Metadata[MetaStep] + " " + f.Metadata[MetaValLoss]
	}
	if w, m := best(); w != 1+2+3+4 || m != "4 1.5" {
		t.Fatalf("best after 6 steps: w %v, step and loss %s (want step 4's, 10, at 1.5)", w, m)
	}
	if _, _, err := runCounter(t, context.Background(), &counter{steps: 10, evalEvery: 2, rate: 1, val: val}, out, true); err != nil {
		t.Fatal(err)
	}
	if w, m := best(); w != 36 || m != "8 1.25" {
		t.Fatalf("best after resuming to 10: w %v, %s (want step 8's, 36, at 1.25)", w, m)
	}
	none := t.TempDir()
	if _, _, err := runCounter(t, context.Background(), &counter{steps: 4, evalEvery: 2, rate: 1}, none, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(none, BestFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a model without validation losses wrote best.safetensors (%v)", err)
	}
}

// TestRunFailureCleansUp: a run that fails before its first checkpoint
// (a NaN loss at step 2) says so in one line and leaves no --out it made;
// one that fails later keeps its checkpoint and lines.
func TestRunFailureCleansUp(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	_, _, err := runCounter(t, context.Background(), &counter{steps: 5, evalEvery: 10, rate: 1, nanAt: 2}, out, false)
	if err == nil || !strings.Contains(err.Error(), "step 2: the loss is NaN") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("NaN at step 2: %v", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the failed run left its --out (%v)", err)
	}
	later := filepath.Join(t.TempDir(), "run")
	if _, _, err := runCounter(t, context.Background(), &counter{steps: 5, saveEvery: 2, evalEvery: 10, rate: 1, nanAt: 4}, later, false); err == nil {
		t.Fatal("NaN at step 4: no error")
	}
	if !Resumable(later) || len(metricsLines(t, later)) != 3 {
		t.Fatalf("a run that failed after its checkpoint of step 2 lost it (resumable %v)", Resumable(later))
	}
}

// TestResumeCleansLitter: resuming removes the temporary files a write
// killed by SIGKILL left (.model.safetensors.tmp*, ...), and cuts
// metrics.jsonl after the checkpoint's step (lines logged after it, and a
// line cut short, are dropped: the resumed run logs them again).
func TestResumeCleansLitter(t *testing.T) {
	out := t.TempDir()
	if _, _, err := runCounter(t, context.Background(), &counter{steps: 3, evalEvery: 10, rate: 1}, out, false); err != nil {
		t.Fatal(err)
	}
	want := metricsLines(t, out)
	litter := []string{".model.safetensors.tmp123", ".state.safetensors.tmp9", ".best.safetensors.tmpx", ".loss.png.tmp1"}
	for _, n := range litter {
		if err := os.WriteFile(filepath.Join(out, n), []byte("cut short"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	keep := filepath.Join(out, "notes.txt")
	os.WriteFile(keep, []byte("mine"), 0o644)
	f, _ := os.OpenFile(filepath.Join(out, MetricsFile), os.O_APPEND|os.O_WRONLY, 0)
	fmt.Fprintf(f, "{\"step\":4,\"loss\":10}\n{\"step\":5,\"loss\":15}\n{\"step\":6,\"lo")
	f.Close()
	lines, _, err := runCounter(t, context.Background(), &counter{steps: 5, evalEvery: 10, rate: 1}, out, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range litter {
		if _, err := os.Stat(filepath.Join(out, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after the resume", n)
		}
	}
	if _, err := os.Stat(keep); err != nil {
		t.Error("the resume removed a file of the user's")
	}
	got := metricsLines(t, out)
	if strings.Join(got, "\n") != strings.Join(append(want, lines...), "\n") || strings.Count(strings.Join(got, "\n"), `"step":4`) != 1 {
		t.Fatalf("metrics.jsonl after resume:\n%s\nwant the first run's lines, then steps 4 and 5 once", strings.Join(got, "\n"))
	}
}

// TestRunLineOrder: a loss line's fields keep their order: step, the
// model's position fields, loss, lr, throughput, step_ms.
func TestRunLineOrder(t *testing.T) {
	l := Line{{"step", 3}, {"epoch", 1}, {"loss", float32(0.25)}, {"lr", float32(0.001)}, {"samples_per_s", 12.5}, {"step_ms", 1.5}}
	b, err := json.Marshal(l)
	if err != nil || string(b) != `{"step":3,"epoch":1,"loss":0.25,"lr":0.001,"samples_per_s":12.5,"step_ms":1.5}` {
		t.Fatalf("%s (%v)", b, err)
	}
}
