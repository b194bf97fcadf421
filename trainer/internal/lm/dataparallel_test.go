package lm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nccl/nccltest"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

// lmTestConfig is the tiny GPT of the host tests: dropout and clipping
// on, 12 steps, evaluations at 6 and 12.
func lmTestConfig() Config {
	cfg := DefaultConfig()
	cfg.Model.Layers, cfg.Model.Heads, cfg.Model.DModel, cfg.Model.Block, cfg.Model.Dropout = 2, 2, 16, 8, 0.1
	cfg.Batch, cfg.Steps, cfg.Warmup, cfg.DecaySteps, cfg.EvalEvery, cfg.EvalBatches, cfg.Seed = 4, 12, 2, 12, 6, 2, 5
	return cfg
}

// lmHostRun trains lmTestConfig on the host through RunLM and returns its
// stdout lines without the timing fields and its checkpoint's tensors.
func lmHostRun(t *testing.T, corpus *data.Corpus, o LMOptions) ([]string, map[string][]byte) {
	t.Helper()
	o.Out = t.TempDir()
	lines, _ := lmHostRanks(t, corpus, lmTestConfig(), 1, o, nil)
	return lines, checkpointTensors(t, o.Out)
}

// lmHostRanks runs cfg on n ranks of the host in goroutines of this
// process, joined by nccltest's World (n = 1: one RunLM alone), with o as each
// rank's options (World and comm set here; o.Out shared, as on a shared
// file system), and ctxs[r] as rank r's context when given. It returns
// rank 0's stdout lines (timing fields dropped) and every rank's result.
func lmHostRanks(t *testing.T, corpus *data.Corpus, cfg Config, n int, o LMOptions, ctxs []context.Context) ([]string, []LMResult) {
	t.Helper()
	o.Alloc, o.Corpus, o.LogEvery, o.Precision = host(), corpus, 1, ops.PrecF32
	outs := make([]bytes.Buffer, n)
	res := make([]LMResult, n)
	errs := make([]error, n)
	fw := nccltest.NewWorld(n)
	var wg sync.WaitGroup
	for r := range n {
		or := o
		or.Stdout = &outs[r]
		if n > 1 {
			or.World = dist.World{Rank: r, Size: n, LocalRank: r, LocalSize: n, Nodes: 1, MasterAddr: "127.0.0.1"}
			or.comm = fw.Comm(r)
		}
		ctx := context.Background()
		if ctxs != nil && ctxs[r] != nil {
			ctx = ctxs[r]
		}
		wg.Go(func() {
			res[r], errs[r] = RunLM(ctx, cfg, or)
			if errs[r] != nil {
				fw.Fail(fmt.Errorf("rank %d: %w", r, errs[r]))
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d of %d: %v", r, n, err)
		}
	}
	for r := 1; r < n; r++ {
		if outs[r].Len() != 0 {
			t.Fatalf("rank %d wrote to its stdout: %q", r, outs[r].String())
		}
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(outs[0].String()), "\n") {
		lines = append(lines, stripTimes(l))
	}
	return lines, res
}

func checkpointTensors(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	f, err := ckpt.ReadFile(filepath.Join(dir, driver.StateFile))
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
	return ts
}

// stripTimes drops the fields of a JSON line that depend on the clock.
func stripTimes(l string) string {
	var kept []string
	for _, f := range strings.Split(strings.TrimSuffix(strings.TrimPrefix(l, "{"), "}"), ",") {
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
	cfg := DefaultConfig()
	cfg.Model.Layers, cfg.Model.Heads, cfg.Model.DModel, cfg.Model.Block, cfg.Model.Vocab = 2, 2, 16, 8, corpus.Tok.Vocab()
	h := device.NewHost()
	e, err := ops.NewEngine(h, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := newLMWith(e, device.Local{Dev: h}, "", cfg, ops.PrecF32, true, "",
		&driver.DP{Comm: nccl.Solo(h), Bucket: driver.BucketConfig(4 << 10)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.free()
	if n := len(l.dp.Layout().Buckets); n < 3 {
		t.Fatalf("%d buckets", n)
	}
}

// TestLMWorldChecks: a batch that does not divide by the world size, and
// a world of several ranks on the host, fail with one line each before
// anything is written.
func TestLMWorldChecks(t *testing.T) {
	corpus := testCorpus(t)
	cfg := DefaultConfig()
	cfg.Batch = 5
	w := dist.World{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, Nodes: 1, MasterAddr: "127.0.0.1", MasterPort: 1, RendezvousPort: 1}
	out := t.TempDir()
	o := LMOptions{Alloc: host(), Corpus: corpus, Out: out, LogEvery: 1, Stdout: &bytes.Buffer{}, World: w}
	_, err := RunLM(context.Background(), cfg, o)
	if !errors.Is(err, driver.ErrConfig) || !strings.Contains(err.Error(), "--batch 5 does not divide by the world size 2") {
		t.Fatalf("batch 5 over 2 ranks: %v", err)
	}
	cfg.Batch = 4
	cfg.Optim = "kfac"
	_, err = RunLM(context.Background(), cfg, o)
	if !errors.Is(err, driver.ErrConfig) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "--optim kfac with 2 ranks") {
		t.Fatalf("K-FAC over 2 ranks: %v", err)
	}
	cfg.Optim = ""
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

// lmLine is a JSON line of a language-model run.
type lmLine struct {
	Step     int      `json:"step"`
	Loss     *float64 `json:"loss"`
	GradNorm *float64 `json:"grad_norm"`
	ValLoss  *float64 `json:"val_loss"`
}

func parseLMLines(t *testing.T, lines []string) []lmLine {
	t.Helper()
	var out []lmLine
	for _, s := range lines {
		var l lmLine
		if err := json.Unmarshal([]byte("{"+s+"}"), &l); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		out = append(out, l)
	}
	return out
}

// closeLines requires got and want to be the same sequence of lines with
// losses and gradient norms within tol relative and validation losses
// (written to 4 decimals) within 2e-4.
func closeLines(t *testing.T, what string, got, want []lmLine, tol float64) {
	t.Helper()
	closeLinesVal(t, what, got, want, tol, 0)
}

// closeLinesVal is closeLines with validation losses within valTol
// relative (0: 2e-4 absolute, what rounding to 4 decimals allows).
func closeLinesVal(t *testing.T, what string, got, want []lmLine, tol, valTol float64) {
	t.Helper()
	closeLinesNorm(t, what, got, want, tol, tol, valTol)
}

// closeLinesNorm is closeLinesVal with the gradient norms within normTol
// relative.
func closeLinesNorm(t *testing.T, what string, got, want []lmLine, tol, normTol, valTol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d lines, want %d", what, len(got), len(want))
	}
	rel := func(a, b *float64) float64 {
		if a == nil || b == nil {
			if a != b {
				return math.Inf(1)
			}
			return 0
		}
		return math.Abs(*a-*b) / math.Abs(*b)
	}
	worst, worstNorm := 0.0, 0.0
	for i := range want {
		g, w := got[i], want[i]
		if g.Step != w.Step || (g.Loss == nil) != (w.Loss == nil) || (g.ValLoss == nil) != (w.ValLoss == nil) {
			t.Fatalf("%s: line %d is of step %d, want a line like %+v", what, i+1, g.Step, w)
		}
		rl, rn := rel(g.Loss, w.Loss), rel(g.GradNorm, w.GradNorm)
		if !(rl <= tol) || !(rn <= normTol) {
			t.Fatalf("%s: step %d: loss %v, norm %v; want %v, %v (relative %.2g and %.2g; bounds %.0e and %.0e)", what, g.Step,
				*g.Loss, *g.GradNorm, *w.Loss, *w.GradNorm, rl, rn, tol, normTol)
		}
		worst, worstNorm = max(worst, rl), max(worstNorm, rn)
		vbound := 2e-4
		if valTol > 0 && w.ValLoss != nil {
			vbound = max(vbound, valTol*math.Abs(*w.ValLoss))
		}
		if g.ValLoss != nil && !(math.Abs(*g.ValLoss-*w.ValLoss) <= vbound) {
			t.Fatalf("%s: validation loss at step %d: %v, want %v", what, g.Step, *g.ValLoss, *w.ValLoss)
		}
	}
	t.Logf("%s: %d lines, largest relative difference %.2g (loss), %.2g (gradient norm)", what, len(got), worst, worstNorm)
}

// TestLMRanksEqualOne: 2 and 4 ranks on the host (goroutines joined by
// nccltest's World in NCCL's place), each training on its rows of every global
// batch of 4 sequences with dropout masks keyed to those rows, give the
// losses, gradient norms and validation losses of one process on the
// global batch within 1e-5 relative (the order of the sums over rows is
// all that differs), rank 0 alone writing. The tape's hook all-reduces a
// bucket as soon as it is complete, so a gradient marked before its last
// write (the tied embedding) would be averaged without its embedding
// contribution, and the norms would differ from the first step.
func TestLMRanksEqualOne(t *testing.T) {
	corpus := testCorpus(t)
	cfg := lmTestConfig()
	one, _ := lmHostRanks(t, corpus, cfg, 1, LMOptions{Out: t.TempDir()}, nil)
	want := parseLMLines(t, one)
	if len(want) != 14 {
		t.Fatalf("%d lines", len(want))
	}
	for _, n := range []int{2, 4} {
		out := t.TempDir()
		got, _ := lmHostRanks(t, corpus, cfg, n, LMOptions{Out: out, BucketBytes: 4 << 10}, nil)
		closeLines(t, fmt.Sprintf("%d ranks", n), parseLMLines(t, got), want, 1e-5)
		m, err := os.ReadFile(filepath.Join(out, driver.MetricsFile))
		if err != nil {
			t.Fatal(err)
		}
		if k := strings.Count(string(m), "\n"); k != len(want) {
			t.Fatalf("%d ranks: metrics.jsonl has %d lines, want %d (rank 0's alone)", n, k, len(want))
		}
	}
}

// TestLMResumeAcrossWorldSizes: 6 steps on 2 ranks resumed on 1 process,
// and 6 steps on 1 process resumed on 2 ranks, continue with the losses
// of 12 uninterrupted steps (within 1e-5): the checkpoint holds the
// replicated state, and the data and dropout masks depend on the step,
// not on the world.
func TestLMResumeAcrossWorldSizes(t *testing.T) {
	corpus := testCorpus(t)
	cfg := lmTestConfig()
	full, _ := lmHostRanks(t, corpus, cfg, 1, LMOptions{Out: t.TempDir()}, nil)
	want := parseLMLines(t, full)
	for _, c := range [][2]int{{2, 1}, {1, 2}} {
		out := t.TempDir()
		first := cfg
		first.Steps = 6
		lmHostRanks(t, corpus, first, c[0], LMOptions{Out: out}, nil)
		r, err := driver.ReadResume(out)
		if err != nil {
			t.Fatal(err)
		}
		if step := r.Stored.Step; step != 6 {
			t.Fatalf("checkpoint at step %d", step)
		}
		got, _ := lmHostRanks(t, corpus, cfg, c[1], LMOptions{Out: out, Resume: r}, nil)
		closeLines(t, fmt.Sprintf("%d ranks, then %d", c[0], c[1]), parseLMLines(t, got), want[7:], 1e-5)
	}
}

// TestLMStopAgreed: a signal that reaches rank 1 only stops both ranks at
// the same step (they agree at the loss line), with rank 0's checkpoint
// written there.
func TestLMStopAgreed(t *testing.T) {
	corpus := testCorpus(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // rank 1 is "signalled" before its first step
	out := t.TempDir()
	_, res := lmHostRanks(t, corpus, lmTestConfig(), 2, LMOptions{Out: out}, []context.Context{nil, ctx})
	for r, x := range res {
		if !x.Interrupted || x.Step != 1 {
			t.Fatalf("rank %d: interrupted %v after step %d, want after step 1", r, x.Interrupted, x.Step)
		}
	}
	if _, _, _, step, err := ReadCheckpoint(filepath.Join(out, driver.ModelFile)); err != nil || step != 1 {
		t.Fatalf("checkpoint: step %d, %v", step, err)
	}
}

// TestLMRanksBF16Comm: 2 and 4 ranks whose gradient buckets travel in
// bf16 (LMOptions.GradComm, the reducer's Compress; the stand-in reduces
// bf16 as NCCL does, rounding every addition) give the losses, gradient
// norms and validation losses of one process (f32 throughout) within 1e-2
// relative: the bound of trainer/dp_gpu_test.go's bf16 case, 2.6 bf16
// units (2⁻⁸ ≈ 3.9e-3 relative) of roundoff. Each averaged gradient is
// then within n/2 bf16 units of the mean of the ranks' magnitudes
// (TestLMBF16CommGrads); AdamW normalises the update by the gradient's
// running magnitude, so a relative error of that size in a gradient moves
// a parameter by about that fraction of the learning rate, and the loss
// by far less than one bf16 unit: the measured difference is logged.
// Every host op computes in f32, so the bound here is loose: it is the
// bound a GPU run under bf16 autocast keeps.
func TestLMRanksBF16Comm(t *testing.T) {
	corpus := testCorpus(t)
	cfg := lmTestConfig()
	one, _ := lmHostRanks(t, corpus, cfg, 1, LMOptions{Out: t.TempDir()}, nil)
	want := parseLMLines(t, one)
	for _, n := range []int{2, 4} {
		var log bytes.Buffer
		got, _ := lmHostRanks(t, corpus, cfg, n, LMOptions{Out: t.TempDir(), BucketBytes: 4 << 10, GradComm: tensor.BF16, Log: &log}, nil)
		closeLinesVal(t, fmt.Sprintf("%d ranks, bf16 communication", n), parseLMLines(t, got), want, 1e-2, 1e-2)
		if !strings.Contains(log.String(), "averaged during the backward in bf16") {
			t.Fatalf("%d ranks: the log does not say the gradients travel in bf16:\n%s", n, log.String())
		}
	}
}

// TestLMBF16CommIgnoredAlone: one process with GradComm bf16 (gradients
// in buckets or not) trains bitwise as with f32 and says it ignored it;
// another dtype is refused.
func TestLMBF16CommIgnoredAlone(t *testing.T) {
	corpus := testCorpus(t)
	want, wantT := lmHostRun(t, corpus, LMOptions{})
	for _, buckets := range []bool{false, true} {
		var log bytes.Buffer
		got, gotT := lmHostRun(t, corpus, LMOptions{GradComm: tensor.BF16, Log: &log, buckets: buckets})
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotT, wantT) {
			t.Fatalf("buckets %v: one process with bf16 communication trained differently", buckets)
		}
		if !strings.Contains(log.String(), "--grad-comm bf16 ignored") {
			t.Fatalf("buckets %v: log:\n%s", buckets, log.String())
		}
	}
	o := LMOptions{Alloc: host(), Corpus: corpus, Out: t.TempDir(), LogEvery: 1, Stdout: &bytes.Buffer{}, GradComm: tensor.F16}
	if _, err := RunLM(context.Background(), lmTestConfig(), o); !errors.Is(err, driver.ErrConfig) || !strings.Contains(err.Error(), "--grad-comm f16") {
		t.Fatalf("f16 communication: %v", err)
	}
}

// localComm is rank rank of n that reduces nothing (IsSolo: the reducer
// skips its buckets), for a rank's own gradients of its rows.
type localComm struct{ rank, n int }

func (c localComm) IsSolo() bool { return true }
func (c localComm) Rank() int    { return c.rank }
func (c localComm) Size() int    { return c.n }
func (c localComm) AllReduce(*ops.Engine, *tensor.Tensor, *tensor.Tensor, nccl.Op) error {
	return errors.New("localComm: no collectives")
}
func (c localComm) BroadcastAll(*ops.Engine, []*tensor.Tensor, int) error {
	return errors.New("localComm: no collectives")
}
func (c localComm) ReduceScatter(*ops.Engine, *tensor.Tensor, *tensor.Tensor, nccl.Op) error {
	return errors.New("localComm: no collectives")
}
func (c localComm) AllGather(*ops.Engine, *tensor.Tensor, *tensor.Tensor) error {
	return errors.New("localComm: no collectives")
}
func (c localComm) Broadcast(*ops.Engine, *tensor.Tensor, *tensor.Tensor, int) error {
	return errors.New("localComm: no collectives")
}
func (c localComm) Group(e *ops.Engine, fn func() error) error { return fn() }

// dpStepGrads runs the first training step of cfg (initial weights, the
// first batch) as n ranks on the host, rank r's collective mk(r), and
// returns each rank's gradient buckets after the step (reduced, unless
// the collective reduces nothing).
func dpStepGrads(t *testing.T, corpus *data.Corpus, cfg Config, n int, gradComm tensor.DType, mk func(r int) driver.Collective,
	fail func(error)) [][]float32 {
	t.Helper()
	cfg.Model.Vocab = corpus.Tok.Vocab()
	out := make([][]float32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			errs[r] = func() error {
				e, err := ops.NewEngine(device.NewHost(), ops.Options{})
				if err != nil {
					return err
				}
				l, err := newLMWith(e, host(), "", cfg, ops.PrecF32, true, "",
					&driver.DP{Comm: mk(r), Bucket: driver.BucketConfig(4 << 10), GradComm: gradComm})
				if err != nil {
					return err
				}
				defer l.free()
				local, block := cfg.Batch/n, cfg.Model.Block
				x, y := make([]int32, local*block), make([]int32, local*block)
				if err := data.BlockRows(corpus.Train, x, y, cfg.Batch, block, cfg.Seed, 0, r*local, local); err != nil {
					return err
				}
				if err := errors.Join(l.train.Idx.Write(tensor.AsBytes(x)), l.train.Targets.Write(tensor.AsBytes(y)),
					l.lr.WriteF32([]float32{1})); err != nil {
					return err
				}
				if err := l.compute(e, nil); err != nil {
					return err
				}
				for _, b := range l.dp.Grads().Buckets {
					v, err := b.ReadFloat32()
					if err != nil {
						return err
					}
					out[r] = append(out[r], v...)
				}
				return nil
			}()
			if errs[r] != nil && fail != nil {
				fail(fmt.Errorf("rank %d: %w", r, errs[r]))
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d of %d: %v", r, n, err)
		}
	}
	return out
}

// TestLMBF16CommGrads: after one step on 2 and 4 ranks, the gradients
// averaged in bf16 are the same on every rank, are bf16 numbers (the
// result of a bf16 sum, cast back exactly), and differ from the ones
// averaged in f32 by at most n·2⁻⁸·S per element, S = Σᵣ|gᵣ|/n, the mean
// of the ranks' own gradients' magnitudes. bf16 keeps 8 significant bits,
// so rounding to it moves a value by at most 2⁻⁸ of itself (half a unit
// in the last place; that unit is 2⁻⁷ to 2⁻⁸ of the value): each rank's
// gradient is rounded once by the cast (2⁻⁸·|gᵣ|/n after the exact 1/n
// of the average, n a power of two: 2⁻⁸·S in all) and each of the n − 1
// additions rounds a partial sum no larger than about S ((n − 1)·2⁻⁸·S).
// Relative to the average itself no bound holds where the ranks'
// gradients cancel. A slack of 2⁻¹⁴·S covers the second-order terms and
// the f32 average's own rounding.
func TestLMBF16CommGrads(t *testing.T) {
	corpus := testCorpus(t)
	cfg := lmTestConfig()
	for _, n := range []int{2, 4} {
		own := dpStepGrads(t, corpus, cfg, n, 0, func(r int) driver.Collective { return localComm{r, n} }, nil)
		reduced := map[tensor.DType][][]float32{}
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			fw := nccltest.NewWorld(n)
			reduced[dt] = dpStepGrads(t, corpus, cfg, n, dt, func(r int) driver.Collective { return fw.Comm(r) }, fw.Fail)
		}
		f, b := reduced[tensor.F32], reduced[tensor.BF16]
		for r := 1; r < n; r++ {
			if !reflect.DeepEqual(b[r], b[0]) || !reflect.DeepEqual(f[r], f[0]) {
				t.Fatalf("%d ranks: rank %d's averaged gradients differ from rank 0's", n, r)
			}
		}
		worst, differ, nonzero := 0.0, 0, 0
		for i := range f[0] {
			s := 0.0
			for r := range n {
				s += math.Abs(float64(own[r][i]))
			}
			s /= float64(n)
			if s == 0 {
				if f[0][i] != 0 || b[0][i] != 0 {
					t.Fatalf("%d ranks: element %d: no rank has a gradient, averaged %v (f32) and %v (bf16)", n, i, f[0][i], b[0][i])
				}
				continue
			}
			nonzero++
			if tensor.BF16ToF32(tensor.BF16FromF32(b[0][i])) != b[0][i] {
				t.Fatalf("%d ranks: element %d averaged in bf16 is %v, not a bf16 number", n, i, b[0][i])
			}
			d := math.Abs(float64(b[0][i]) - float64(f[0][i]))
			if d != 0 {
				differ++
			}
			if bound := (float64(n)*math.Exp2(-8) + math.Exp2(-14)) * s; !(d <= bound) {
				t.Fatalf("%d ranks: element %d: %v averaged in bf16, %v in f32 (difference %.3g > %.3g; S = %.3g)",
					n, i, b[0][i], f[0][i], d, bound, s)
			}
			worst = max(worst, d/s)
		}
		if differ < nonzero/2 {
			t.Fatalf("%d ranks: only %d of %d gradients changed by bf16 communication", n, differ, nonzero)
		}
		t.Logf("%d ranks: %d gradients, %d changed by bf16 communication; largest difference %.3g·S = %.2f·2⁻⁸·S (bound %d·2⁻⁸·S)",
			n, nonzero, differ, worst, worst/math.Exp2(-8), n)
	}
}

// TestLMResumeChangesGradComm: the gradients' communication dtype is not
// part of the checkpoint: 6 steps on 2 ranks in bf16 resumed on 2 ranks
// in f32 (and the reverse) continue within TestLMRanksBF16Comm's bound of
// 12 uninterrupted steps of one process.
func TestLMResumeChangesGradComm(t *testing.T) {
	corpus := testCorpus(t)
	cfg := lmTestConfig()
	full, _ := lmHostRanks(t, corpus, cfg, 1, LMOptions{Out: t.TempDir()}, nil)
	want := parseLMLines(t, full)
	for _, c := range [][2]tensor.DType{{tensor.BF16, tensor.F32}, {tensor.F32, tensor.BF16}} {
		out := t.TempDir()
		first := cfg
		first.Steps = 6
		lmHostRanks(t, corpus, first, 2, LMOptions{Out: out, GradComm: c[0]}, nil)
		r, err := driver.ReadResume(out)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := lmHostRanks(t, corpus, cfg, 2, LMOptions{Out: out, Resume: r, GradComm: c[1]}, nil)
		closeLinesVal(t, fmt.Sprintf("%v, then %v", c[0], c[1]), parseLMLines(t, got), want[7:], 1e-2, 1e-2)
	}
}

// TestLMRanksShareRoots: Shampoo and SOAP on 2 ranks that share
// their preconditioner refreshes (optim.ShareRoots, the default) write
// the lines of 2 ranks that each compute every refresh (driver.ShareRoots
// off) exactly — the broadcast parts are the same matrices — while rank 0
// computes fewer of the matrices than one process does. (Two ranks' losses
// are not held to one process's here: their averaged gradients round
// apart, and SOAP's first eigenbases of rank-deficient statistics turn
// that into differences of 1e-3.)
func TestLMRanksShareRoots(t *testing.T) {
	corpus := testCorpus(t)
	blocks := func(lines []string) int {
		t.Helper()
		n := -1
		for _, s := range lines {
			var l struct {
				Roots *driver.RootsLine `json:"roots"`
			}
			if err := json.Unmarshal([]byte("{"+s+"}"), &l); err != nil {
				t.Fatalf("%q: %v", s, err)
			}
			if l.Roots != nil {
				n = l.Roots.Blocks
			}
		}
		return n
	}
	for _, name := range []string{"shampoo", "soap"} {
		t.Run(name, func(t *testing.T) {
			cfg := lmTestConfig()
			cfg.Optim = name
			cfg.Precond = driver.OptimConfig{UpdateFreq: 3, Async: true, MaxStaleness: 1, MaxBlock: 16}
			one, _ := lmHostRanks(t, corpus, cfg, 1, LMOptions{Out: t.TempDir()}, nil)
			shared, _ := lmHostRanks(t, corpus, cfg, 2, LMOptions{Out: t.TempDir()}, nil)
			driver.ShareRoots = false
			each, _ := lmHostRanks(t, corpus, cfg, 2, LMOptions{Out: t.TempDir()}, nil)
			driver.ShareRoots = true
			// The same losses, gradient norms and validation losses, bit
			// for bit (the roots lines differ in their counts and times).
			if ls, le := parseLMLines(t, shared), parseLMLines(t, each); !slices.EqualFunc(ls, le, func(a, b lmLine) bool {
				same := func(x, y *float64) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
				return a.Step == b.Step && same(a.Loss, b.Loss) && same(a.GradNorm, b.GradNorm) && same(a.ValLoss, b.ValLoss)
			}) {
				t.Fatalf("shared refreshes:\n%s\nevery rank computing every refresh:\n%s", strings.Join(shared, "\n"), strings.Join(each, "\n"))
			}
			b1, bs, be := blocks(one), blocks(shared), blocks(each)
			if !(b1 > 0 && be == b1 && bs > 0 && bs < b1) {
				t.Fatalf("matrices computed by rank 0: %d shared, %d each rank all, %d one process", bs, be, b1)
			}
			t.Logf("rank 0 computed %d of %d matrices", bs, b1)
		})
	}
}

// TestLMRanksOtherOptimizers: optimizers that read only the averaged
// gradients (Muon, AdamATan2) train on 2 host ranks with the losses of one
// process (within 1e-5): data-parallel runs take them as they take AdamW.
func TestLMRanksOtherOptimizers(t *testing.T) {
	corpus := testCorpus(t)
	for _, name := range []string{"muon", "adamatan2"} {
		cfg := lmTestConfig()
		cfg.Optim = name
		one, _ := lmHostRanks(t, corpus, cfg, 1, LMOptions{Out: t.TempDir()}, nil)
		two, _ := lmHostRanks(t, corpus, cfg, 2, LMOptions{Out: t.TempDir()}, nil)
		closeLines(t, name+", 2 ranks against 1", parseLMLines(t, two), parseLMLines(t, one), 1e-5)
	}
}
