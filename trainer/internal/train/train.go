package train

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// Output file names inside the run directory.
const (
	ModelFile   = "model.safetensors"
	MetricsFile = "metrics.jsonl"
	PlotFile    = "loss.png"
)

// Options are the parts of a run that do not change its numbers.
type Options struct {
	Alloc     device.Allocator // where parameters, gradients, state and activations live
	Precision ops.Precision
	// Graph captures the training step as CUDA graphs and replays them
	// (CUDA devices only; the host ignores it).
	Graph bool
	// FuseBackward lets the model fuse each activation derivative into the
	// next layer's dx GEMM (ops.Engine.LinearBackwardChain). It changes the
	// rounding, not the formula: keep it the same across a resume.
	FuseBackward bool
	Run          string // buffer name prefix: <Run>/params/fc0.weight, ...
	Train        *data.Set
	Test         *data.Set
	Out          string // run directory (created if missing)
	LogEvery     int    // steps between loss lines (>= 1)
	Stdout       io.Writer
	Log          io.Writer // human messages (stderr), or nil
	Progress     io.Writer // progress bar target (a terminal), or nil
	// Resume, when non-nil, is a checkpoint to continue from at Pos.
	Resume *ckpt.File
	Pos    Position
	// OptimizerSocket, when set, runs the optimizer in the service there
	// (`optimizer serve`); Alloc must then be a pool client.
	OptimizerSocket string
}

// StepLine is the JSON line written every LogEvery steps. Epoch is 1-based;
// Loss is the mean cross-entropy of that step's batch (not an average over
// the interval, so an interrupted and resumed run prints the same lines);
// SamplesPerS and StepMS are measured over the interval since the last line
// (wall clock, including the host's batch preparation). MFU, present when
// the device's peak is known (ops.PeakFLOPS), is the GEMM FLOP/s of those
// steps (nn.MLP.StepFLOPs) over that peak for the run's precision.
// GradNorm, with clipping on, is the norm of that step's gradients before
// clipping.
type StepLine struct {
	Step        int      `json:"step"`
	Epoch       int      `json:"epoch"`
	Loss        float32  `json:"loss"`
	LR          float32  `json:"lr"`
	SamplesPerS float64  `json:"samples_per_s"`
	StepMS      float64  `json:"step_ms"`
	MFU         *float64 `json:"mfu,omitempty"`
	GradNorm    *float32 `json:"grad_norm,omitempty"`
}

// EpochLine is the JSON line written after every epoch: the accuracy of the
// model on the whole test set.
type EpochLine struct {
	Step         int        `json:"step"`
	Epoch        int        `json:"epoch"`
	TestAccuracy float64    `json:"test_accuracy"`
	Roots        *RootsLine `json:"roots,omitempty"` // Shampoo, SOAP, K-FAC
}

// Result says how a run ended.
type Result struct {
	Pos          Position
	Interrupted  bool    // stopped by ctx before the last epoch ended
	TestAccuracy float64 // after the last completed epoch (−1 if none completed here)
	Elapsed      time.Duration
}

// Run trains cfg. It stops after the step during which ctx is cancelled,
// writing a checkpoint from which Options.Resume continues exactly.
func Run(ctx context.Context, cfg Config, o Options) (Result, error) {
	res := Result{TestAccuracy: -1}
	start := time.Now()
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	if o.LogEvery < 1 {
		return res, fmt.Errorf("%w: --log-every %d (want >= 1)", ErrConfig, o.LogEvery)
	}
	trainSet := o.Train.Limit(cfg.Limit)
	if err := checkShapes(cfg, trainSet, o.Test); err != nil {
		return res, err
	}
	nb := data.Batches(trainSet.N, cfg.Batch, true)
	if nb == 0 {
		return res, fmt.Errorf("%w: %d training examples make no batch of %d", ErrConfig, trainSet.N, cfg.Batch)
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return res, fmt.Errorf("train: %w", err)
	}
	eng, err := ops.NewEngine(o.Alloc.Device(), ops.Options{Precision: o.Precision, NoLinearChain: !o.FuseBackward})
	if err != nil {
		return res, err
	}
	defer closeEngine(eng)
	alloc, book, mem, err := serviceAlloc(o.Alloc, o.OptimizerSocket)
	if err != nil {
		return res, err
	}
	m, err := newModelOn(alloc, cfg, o.Run, cfg.Batch, o.OptimizerSocket == "", eng, o.Precision)
	if err != nil {
		return res, err
	}
	defer m.free()
	if o.OptimizerSocket != "" {
		if err := m.useService(eng, alloc, o.Run, o.OptimizerSocket, book, mem); err != nil {
			return res, err
		}
	}
	pos := Position{}
	if o.Resume != nil {
		if err := m.load(o.Resume, true); err != nil {
			return res, err
		}
		pos = o.Pos
	}
	ml, err := openMetrics(o.Out, o.Resume != nil, o.Stdout)
	if err != nil {
		return res, err
	}
	defer ml.close()
	emit := ml.emit
	save := func(pos Position) error {
		sp := trace.Default().Begin(traceCat, spanCheckpoint)
		sp.Arg(trace.Int(argStep, int64(pos.Step)))
		defer sp.End()
		return m.save(filepath.Join(o.Out, ModelFile), pos, true)
	}
	finish := func(pos Position) error {
		if err := save(pos); err != nil {
			return err
		}
		return Plot(filepath.Join(o.Out, MetricsFile), filepath.Join(o.Out, PlotFile))
	}

	st, err := newStepper(eng, m, o.Graph)
	if err != nil {
		return res, err
	}
	defer st.close()
	if o.Log != nil {
		how := "f32 (the host computes every precision in f32)"
		if eng.IsGraphCapable() {
			how = fmt.Sprintf("%s GEMMs, CUDA graph %s", precisionName(o.Precision), map[bool]string{true: "on", false: "off"}[o.Graph])
		}
		fmt.Fprintf(o.Log, "trainer: training on %v: %s\n", o.Alloc.Device(), how)
	}
	peak, havePeak := ops.PeakFLOPS(o.Alloc.Device(), o.Precision)
	flops := m.mlp.StepFLOPs()
	bar := newProgress(o.Progress, cfg.Epochs, nb)
	tk := trace.Default().Main() // nil: tracing off
	last, lastStep := time.Now(), pos.Step
	var lastLoss float32
	for epoch := pos.Epoch; epoch < cfg.Epochs; epoch++ {
		order := data.Order(trainSet.N, cfg.Seed, epoch)
		first := 0
		if epoch == pos.Epoch {
			first = pos.Batch
		}
		for b := first; b < nb; b++ {
			step := tk.Begin(traceCat, spanStep)
			step.Arg(trace.Int(argStep, int64(pos.Step+1)))
			dp := tk.Begin(traceCat, spanData)
			x, y, err := st.batch()
			if err != nil {
				return res, err
			}
			if err := fill(trainSet, x, y, data.Batch(order, cfg.Batch, b)); err != nil {
				return res, err
			}
			dp.End()
			if err := st.run(); err != nil {
				return res, fmt.Errorf("step %d: %w", pos.Step+1, err)
			}
			pos = Position{Step: pos.Step + 1, Epoch: epoch, Batch: b + 1}
			if pos.Step%o.LogEvery == 0 {
				lp := tk.Begin(traceCat, spanLog)
				l, err := m.mlp.Loss().ReadF32()
				if err != nil {
					return res, err
				}
				lastLoss = l[0]
				now := time.Now()
				n := pos.Step - lastStep
				dt := now.Sub(last).Seconds()
				line := StepLine{Step: pos.Step, Epoch: epoch + 1, Loss: l[0], LR: cfg.LR,
					SamplesPerS: round(float64(n*cfg.Batch)/dt, 1), StepMS: round(dt*1000/float64(n), 3)}
				if havePeak {
					// Significant digits, not decimals: the first interval
					// includes kernel compilation and graph capture, and its
					// MFU is tiny but not zero.
					u := roundSig(flops*float64(n)/dt/peak, 3)
					line.MFU = &u
				}
				if m.norm != nil {
					g, err := m.norm.ReadF32()
					if err != nil {
						return res, err
					}
					line.GradNorm = &g[0]
				}
				if err := emit(line); err != nil {
					return res, err
				}
				last, lastStep = now, pos.Step
				lp.End()
			}
			step.End()
			bar.update(epoch, b+1, lastLoss)
			if ctx.Err() != nil {
				bar.done()
				res.Pos, res.Interrupted, res.Elapsed = pos, true, time.Since(start)
				return res, finish(pos)
			}
		}
		acc, err := evaluate(eng, o.Alloc, o.Run, m, o.Test)
		if err != nil {
			return res, err
		}
		res.TestAccuracy = acc
		pos = Position{Step: pos.Step, Epoch: epoch + 1}
		el := EpochLine{Step: pos.Step, Epoch: epoch + 1, TestAccuracy: acc}
		if m.opt != nil {
			el.Roots = rootsLine(m.opt.Optimizer)
		}
		if err := emit(el); err != nil {
			return res, err
		}
		// A checkpoint per epoch: a crash loses at most one epoch.
		if err := save(pos); err != nil {
			return res, err
		}
		last = time.Now() // evaluation is not training time
	}
	bar.done()
	res.Pos, res.Elapsed = pos, time.Since(start)
	return res, finish(pos)
}

// roundSig rounds v to digits significant decimal digits.
func roundSig(v float64, digits int) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', digits, 64), 64)
	return r
}

func round(v float64, digits int) float64 {
	p := 1.0
	for range digits {
		p *= 10
	}
	return float64(int64(v*p+0.5)) / p
}

func checkShapes(cfg Config, sets ...*data.Set) error {
	for _, s := range sets {
		if s == nil {
			continue
		}
		if cfg.Widths[0] != s.Dim() {
			return fmt.Errorf("%w: --widths starts with %d, the images have %d pixels", ErrConfig, cfg.Widths[0], s.Dim())
		}
		if c := s.Classes(); cfg.Widths[len(cfg.Widths)-1] < c {
			return fmt.Errorf("%w: --widths ends with %d, the data has %d classes", ErrConfig, cfg.Widths[len(cfg.Widths)-1], c)
		}
	}
	return nil
}

// evaluate returns the fraction of set the model classifies correctly, in
// batches of the model's static size (the last one padded with zeros).
func evaluate(e *ops.Engine, a device.Allocator, run string, m *model, set *data.Set) (float64, error) {
	sp := trace.Default().Begin(traceCat, spanEvaluate)
	defer sp.End()
	if set == nil || set.N == 0 {
		return 0, fmt.Errorf("%w: empty evaluation set", ErrConfig)
	}
	bsz := m.mlp.Config().Batch
	d := set.Dim()
	x := make([]float32, bsz*d)
	y := make([]int32, bsz)
	pred, err := tensor.Alloc(a, join(run, "acts/predictions"), tensor.I32, bsz)
	if err != nil {
		return 0, err
	}
	defer pred.Buf.Free()
	order := make([]int, set.N)
	for i := range order {
		order[i] = i
	}
	correct := 0
	for b := range data.Batches(set.N, bsz, false) {
		idx := data.Batch(order, bsz, b)
		clear(x)
		clear(y)
		if err := set.Fill(x, y, idx); err != nil {
			return 0, err
		}
		if err := m.mlp.Input().WriteF32(x); err != nil {
			return 0, err
		}
		if err := m.mlp.Labels().Write(tensor.AsBytes(y)); err != nil {
			return 0, err
		}
		if err := m.mlp.Forward(e); err != nil {
			return 0, err
		}
		if err := m.mlp.Predict(e, pred); err != nil {
			return 0, err
		}
		raw, err := pred.Read()
		if err != nil {
			return 0, err
		}
		p := tensor.BytesAs[int32](raw)
		for k, i := range idx {
			if p[k] == int32(set.Labels[i]) {
				correct++
			}
		}
	}
	return float64(correct) / float64(set.N), nil
}

func join(run, name string) string {
	if run == "" {
		return name
	}
	return run + "/" + name
}

func precisionName(p ops.Precision) string {
	switch p {
	case ops.PrecF32:
		return "f32"
	case ops.PrecTF32:
		return "tf32"
	case ops.PrecBF16:
		return "bf16"
	}
	return fmt.Sprintf("precision(%d)", p)
}
