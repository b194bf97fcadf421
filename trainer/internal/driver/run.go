package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
)

// Options are the parts of a run that do not change its numbers.
type Options struct {
	Model     string           // the model's registered name (checkpoints' metadata "model")
	Alloc     device.Allocator // where parameters, gradients, state and activations live
	Precision ops.Precision
	// Graph captures the training step as a CUDA graph and replays it
	// (CUDA devices only; the host ignores it; so does a trainer that is
	// not Capturable).
	Graph    bool
	Run      string // buffer name prefix: <Run>/params/..., the default pool names
	Out      string // run directory (made when the run starts writing)
	LogEvery int    // steps between loss lines (≥ 1)
	Stdout   io.Writer
	Log      io.Writer // human messages (stderr), or nil
	Progress io.Writer // where the progress bar may go (stderr; libgpu/cli.NewProgress decides), or nil
	// Settings are stored in the state file for a resumed run.
	Settings Settings
	// Resume, when set, is the run to continue (ReadResume).
	Resume *Resume
	// OptimizerSocket, when set, runs the optimizer in the service there
	// (`optimizer serve`); Alloc must then be a pool client.
	OptimizerSocket string
	// World is this process's place in a data-parallel job (dist.FromEnv;
	// the zero World is a process alone). With several ranks, Alloc is
	// this rank's GPU; rank 0 alone writes Out, Stdout, Log and Progress.
	World dist.World
	// BucketBytes is the size limit of a gradient bucket of a
	// data-parallel run (0: dist.DefaultBucketBytes, PyTorch DDP's 25 MiB).
	BucketBytes int64
	// GradComm is the dtype the f32 gradient buckets of a data-parallel
	// run travel in: 0 or tensor.F32 as they are, tensor.BF16 cast for
	// the all-reduce (half the bytes). A process alone ignores it.
	GradComm tensor.DType
	// LastBucketBytes, when positive, caps the last gradient bucket (the
	// embeddings' and first layers', whose collective the backward cannot
	// overlap): dist.BucketConfig.LastBytes (--last-bucket-mb).
	LastBucketBytes int64
	// ShardOptimizer splits the optimizer state of a data-parallel run
	// across its ranks (ZeRO-1: DP.Shard, --shard-optimizer). A process
	// alone ignores it (and says so).
	ShardOptimizer bool
	// HighPriorityComm makes the engine's communication stream with the
	// device's greatest priority (ops.Options.HighPriorityComm;
	// --comm-priority high).
	HighPriorityComm bool
	// NCCL tunes the communicator of several ranks (the CTAs of each
	// collective: --nccl-min-ctas, --nccl-max-ctas).
	NCCL nccl.Config
	// Buckets gives a model that registers DataParallel its gradients in
	// bucket buffers, reduced by a one-rank (Solo) communicator, even
	// alone (tests: the bucket machinery against the model's own
	// gradients).
	Buckets bool
	// Comm, when set, is the communicator of World instead of NCCL's
	// (tests: ranks in goroutines of one process, on the host).
	Comm Collective
}

// EngineTuner is a Task that sets options of the run's engine beyond the
// precision (the MLP's fused activation backward).
type EngineTuner interface {
	EngineOptions(o ops.Options) ops.Options
}

// DataParallel is what a trainer built with Env.DP set provides: the
// tensors rank 0 broadcasts at the start (parameters and optimizer
// state, as DDP's constructor broadcasts the module's state; with
// DP.Shard the parameters' buckets alone, GradBuckets.ParamBuckets: each
// rank loads its own part of the state) and its share of a global batch
// with its gradient buckets, for the run's first lines.
type DataParallel interface {
	Replicas() []*tensor.Tensor
	Share() (share string, b *GradBuckets)
}

// Run trains task. Every step: the trainer fills a staging slot (Fill),
// and the runner copies it into the inputs and queues the step (Compute),
// eagerly or as one replayed CUDA graph; every o.LogEvery steps a loss
// line goes to stdout and metrics.jsonl; every EvalEvery steps and at the
// end an Evaluator evaluates, the best validation loss so far goes to
// best.safetensors and a checkpoint is written; a Saver checkpoints every
// SaveEvery steps too; the end writes the final checkpoint and the plot.
// When ctx is cancelled (SIGINT, SIGTERM) the run stops after the step
// running (with several ranks: at the next loss line, where the ranks
// agree on it), and writes a checkpoint from which o.Resume continues with
// the same losses; an evaluation due at that step (the last one, too) is
// left for the resumed run. A run that fails before its first checkpoint
// removes what it wrote (and --out, when it made it).
func Run(ctx context.Context, task Task, o Options) (res Result, err error) {
	start := time.Now()
	if o.LogEvery < 1 {
		return res, Configf("--log-every %d (want ≥ 1)", o.LogEvery)
	}
	if o.GradComm != 0 && o.GradComm != tensor.F32 && o.GradComm != tensor.BF16 {
		return res, Configf("--grad-comm %v (want f32 or bf16)", o.GradComm)
	}
	config, err := json.Marshal(task.Config())
	if err != nil {
		return res, err
	}
	w := o.World
	if w.Size == 0 {
		w = dist.Single()
	}
	main := w.IsMain()
	if !main {
		o.Stdout, o.Log, o.Progress = io.Discard, nil, nil
	}
	if o.LastBucketBytes < 0 {
		return res, Configf("--last-bucket-mb %g (want ≥ 0; 0 leaves the last bucket as the plan makes it)", bucketMiB(o.LastBucketBytes))
	}
	eo := ops.Options{Precision: o.Precision, HighPriorityComm: o.HighPriorityComm}
	if t, ok := task.(EngineTuner); ok {
		eo = t.EngineOptions(eo)
	}
	eng, err := ops.NewEngine(o.Alloc.Device(), eo)
	if err != nil {
		return res, err
	}
	defer CloseEngine(eng)
	bucket := BucketConfig(o.BucketBytes)
	bucket.LastBytes = o.LastBucketBytes
	var dpc *DP
	if o.Comm != nil {
		dpc = &DP{Comm: o.Comm, Bucket: bucket, GradComm: o.GradComm}
	} else if w.Distributed() || o.Buckets {
		var comm *nccl.Comm
		comm, err = nccl.ConnectConfig(ctx, eng, &dist.Rendezvous{World: w, Logf: func(format string, args ...any) {
			if o.Log != nil {
				fmt.Fprintf(o.Log, "trainer: "+format+"\n", args...)
			}
		}}, o.NCCL)
		if err != nil {
			return res, err
		}
		// A failed rank leaves its peers mid-collective: abort rather
		// than wait for them (ncclCommAbort; Close waits for queued work).
		defer func() {
			if err != nil {
				comm.Abort()
			} else if cerr := comm.Close(); cerr != nil {
				err = cerr
			}
		}()
		dpc = &DP{Comm: comm, Bucket: bucket, GradComm: o.GradComm}
	}
	if dpc != nil {
		dpc.Shard = o.ShardOptimizer && dpc.Comm.Size() > 1
	}
	env := &Env{Engine: eng, Alloc: o.Alloc, Run: o.Run, Precision: o.Precision, Graph: o.Graph, World: w, DP: dpc,
		OptimizerSocket: o.OptimizerSocket, Log: o.Log}
	tr, err := task.Build(env)
	if err != nil {
		return res, err
	}
	defer tr.Free()
	step := 0
	cw := &ckptWriter{dir: o.Out, model: o.Model, config: config, settings: o.Settings, best: math.NaN()}
	if o.Resume != nil {
		if err := tr.Load(o.Resume.File); err != nil {
			return res, err
		}
		step, cw.best = o.Resume.Stored.Step, o.Resume.Best
	}
	var dpt DataParallel
	if dpc != nil {
		var ok bool
		if dpt, ok = tr.(DataParallel); !ok {
			return res, fmt.Errorf("trainer: the model was built for data parallelism without its replicas (driver.DataParallel)")
		}
		if err := dpc.Comm.BroadcastAll(eng, dpt.Replicas(), 0); err != nil {
			return res, fmt.Errorf("broadcasting the parameters from rank 0: %w", err)
		}
	}
	distributed := dpc != nil && w.Distributed()
	var dpr *dpRun
	if distributed {
		if dpr, err = newDPRun(o.Alloc, o.Run, dpc.Comm, len(tr.Metrics().Terms)); err != nil {
			return res, err
		}
		defer dpr.free()
	}

	// The run directory: made now, cleaned of what killed runs left, and
	// removed again (with what this run wrote) if the run fails before its
	// first checkpoint.
	var ml *metricsLog // nil on ranks other than 0: they write no metrics
	checkpointed := false
	if main {
		var made bool
		if made, err = mkdirRun(o.Out); err != nil {
			return res, err
		}
		defer func() {
			if err != nil && !checkpointed && o.Resume == nil {
				os.Remove(filepath.Join(o.Out, MetricsFile))
				os.Remove(filepath.Join(o.Out, PlotFile))
				if made {
					os.Remove(o.Out) // only when empty
				}
			}
		}()
		var removed []string
		if removed, err = RemoveLitter(o.Out); err != nil {
			return res, fmt.Errorf("trainer: %w", err)
		}
		if len(removed) > 0 && o.Log != nil {
			fmt.Fprintf(o.Log, "trainer: removed %d temporary file(s) of writes a killed run left in %s\n", len(removed), o.Out)
		}
		if ml, err = openMetrics(o.Out, o.Resume != nil, step, o.Stdout); err != nil {
			return res, err
		}
		defer ml.close()
	}
	met := tr.Metrics()
	label := met.Unit
	if label == "" {
		label = "samples"
	}
	gatherer, _ := tr.(StateGatherer)
	checkpoint := func(done int, pending bool, ev *Eval) error {
		sp := trace.Default().Begin(TraceCat, SpanCheckpoint)
		sp.Arg(trace.Int(argStep, int64(done)))
		defer sp.End()
		if dpc != nil && gatherer != nil {
			// Every rank, at the same steps: a collective.
			if err := gatherer.GatherState(); err != nil {
				return fmt.Errorf("step %d: gathering the optimizer state on rank 0: %w", done, err)
			}
		}
		if !main {
			return nil
		}
		ck, err := tr.Checkpoint(done)
		if err != nil {
			return err
		}
		if ev != nil {
			if _, err := cw.saveBest(ck, done, ev.ValLoss); err != nil {
				return err
			}
		}
		if err := cw.save(ck, done, pending); err != nil {
			return err
		}
		checkpointed = true
		return nil
	}
	finish := func(done int, pending bool) error {
		if err := checkpoint(done, pending, nil); err != nil {
			return err
		}
		if !main {
			return nil
		}
		return Plot(filepath.Join(o.Out, MetricsFile), filepath.Join(o.Out, PlotFile), met.lossName())
	}

	nIn := len(tr.Inputs())
	inputs := tr.Inputs()
	if distributed {
		inputs = append(append([]*tensor.Tensor(nil), inputs...), dpr.stop)
	}
	cur := 0 // the step being run, for PostStep
	r, err := NewRunner(eng, inputs, tr.Compute, o.Graph && tr.Capturable())
	if err != nil {
		return res, err
	}
	defer r.Close()
	if cp, ok := tr.(ComputePhaser); ok {
		if phase := cp.ComputePhases(); phase != nil {
			r.SetComputePhases(phase)
		}
	}
	if ps, ok := tr.(PostStepper); ok {
		if post := ps.PostStep(); post != nil {
			r.SetPost(func(gt *trace.GPUTimer) error { return post(cur, gt) })
			if pp, ok := tr.(PostPhaser); ok {
				if phase, replayed := pp.PostPhases(); phase != nil {
					r.SetPostPhases(phase, replayed)
				}
			}
		}
	}
	if o.Log != nil {
		how := "f32 (the host computes every precision in f32)"
		if eng.IsGraphCapable() {
			how = fmt.Sprintf("%s, CUDA graph %s", PrecisionName(o.Precision), map[bool]string{true: "on", false: "off"}[o.Graph])
		}
		fmt.Fprintf(o.Log, "trainer: %s on %v: %s\n", tr.Describe(), o.Alloc.Device(), how)
		if distributed {
			share, gb := dpt.Share()
			v, _ := nccl.LibraryVersion()
			last := ""
			if dpc.Bucket.LastBytes > 0 {
				last = fmt.Sprintf(", last ≤ %g MiB", bucketMiB(dpc.Bucket.LastBytes))
			}
			fmt.Fprintf(o.Log, "trainer: data parallel over %d ranks on %d node(s) (NCCL %v): %s; gradients in %d bucket(s) of ≤ %g MiB (first %g MiB%s), %s\n",
				w.Size, w.Nodes, v, share, len(gb.Layout().Buckets), bucketMiB(dpc.Bucket.Bytes), bucketMiB(dpc.Bucket.FirstBytes), last,
				gb.shareNote(o.GradComm))
		} else {
			if o.GradComm == tensor.BF16 {
				fmt.Fprintf(o.Log, "trainer: --grad-comm bf16 ignored: one process communicates no gradients\n")
			}
			if o.ShardOptimizer {
				fmt.Fprintf(o.Log, "trainer: --shard-optimizer ignored: one process holds the whole optimizer state\n")
			}
		}
	}

	ev, hasEval := tr.(Evaluator)
	evalEvery := 0
	if hasEval {
		if evalEvery = ev.EvalEvery(); evalEvery < 1 {
			return res, Configf("evaluation every %d steps (want ≥ 1)", evalEvery)
		}
	}
	saveEvery := 0
	if s, ok := tr.(Saver); ok {
		saveEvery = s.SaveEvery()
	}
	pos, _ := tr.(Positioner)
	after, _ := tr.(AfterStepper)
	// evaluate runs the evaluation after done steps, writes its line and
	// the checkpoint; interrupted: ctx stopped it (its step stays pending).
	evaluate := func(done int) (interrupted bool, err error) {
		sp := trace.Default().Begin(TraceCat, SpanEvaluate)
		e, err := ev.Eval(ctx, done, time.Since(start))
		sp.End()
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return true, nil
			}
			return false, err
		}
		res.Eval, res.Trained = &e, true
		if err := ml.emit(append(Line{{"step", done}}, e.Fields...)); err != nil {
			return false, err
		}
		return false, checkpoint(done, false, &e)
	}
	steps := task.Steps()
	if o.Resume != nil && o.Resume.Pending && hasEval {
		interrupted, err := evaluate(step)
		if err != nil {
			return res, err
		}
		if interrupted {
			res.Step, res.Interrupted, res.Elapsed = step, true, time.Since(start)
			return res, finish(step, true)
		}
	}

	peak, havePeak := ops.PeakFLOPS(o.Alloc.Device(), o.Precision)
	bar := kit.NewProgress(o.Progress, int64(max(steps-step, 0)), "train", "steps")
	first := step
	tk := trace.Default().Main() // nil: tracing off
	last, lastStep := time.Now(), step
	for ; step < steps; step++ {
		sp := tk.Begin(TraceCat, SpanStep)
		sp.Arg(trace.Int(argStep, int64(step+1)))
		dsp := tk.Begin(TraceCat, SpanData)
		b, err := r.Stage()
		if err != nil {
			return res, err
		}
		views := r.Views(b)
		if err := tr.Fill(step, views[:nIn]); err != nil {
			return res, err
		}
		if distributed {
			stop := float32(0)
			if ctx.Err() != nil {
				stop = 1
			}
			tensor.BytesAs[float32](views[nIn])[0] = stop
		}
		dsp.End()
		cur = step
		if err := r.Run(); err != nil {
			return res, fmt.Errorf("step %d: %w", step+1, err)
		}
		res.Trained = true
		done := step + 1
		stopAll := false // every rank agrees to stop here
		if done%o.LogEvery == 0 || (met.LogFinal && done == steps) {
			lp := tk.Begin(TraceCat, SpanLog)
			var loss float32
			var terms []float32 // met.Terms' values, averaged across ranks when distributed
			if distributed {
				if loss, terms, stopAll, err = dpr.agree(eng, met.Loss, met.Terms); err != nil {
					return res, fmt.Errorf("step %d: averaging the loss across ranks: %w", done, err)
				}
			} else {
				v, err := met.Loss.ReadF32()
				if err != nil {
					return res, err
				}
				loss = v[0]
			}
			if math.IsNaN(float64(loss)) || math.IsInf(float64(loss), 0) {
				return res, fmt.Errorf("step %d: the loss is %v (lower --lr, or clip the gradients with --clip)", done, loss)
			}
			res.Loss = loss
			now := time.Now()
			k := float64(done - lastStep)
			dt := now.Sub(last).Seconds()
			line := Line{{"step", done}}
			if pos != nil {
				line = append(line, pos.Position(step)...)
			}
			line = append(line, Field{"loss", loss}, Field{"lr", tr.LR(step)},
				Field{label + "_per_s", Round(met.Items*k/dt, 1)}, Field{"step_ms", Round(dt*1000/k, 3)})
			if havePeak && met.FLOPs > 0 {
				line = append(line, Field{"mfu", RoundSig(met.FLOPs*k/dt/peak, 3)})
			}
			if met.GradNorm != nil {
				g, err := met.GradNorm.ReadF32()
				if err != nil {
					return res, err
				}
				line = append(line, Field{"grad_norm", g[0]})
			}
			for i, t := range met.Terms {
				if !distributed {
					v, err := t.T.ReadF32()
					if err != nil {
						return res, err
					}
					terms = append(terms, v[0])
				}
				line = append(line, Field{t.Name, terms[i]})
			}
			if err := ml.emit(line); err != nil {
				return res, err
			}
			lp.End()
			last, lastStep = now, done
		}
		sp.End()
		bar.Set(int64(done-first), fmt.Sprintf("step %d/%d loss %.4f", done, steps, res.Loss))
		if after != nil {
			if err := after.AfterStep(done); err != nil {
				return res, err
			}
		}
		stopping := ctx.Err() != nil
		if distributed {
			stopping = stopAll
		}
		evalDue := hasEval && (done%evalEvery == 0 || done == steps)
		pending := false
		switch {
		case evalDue && stopping:
			pending = true
		case evalDue:
			interrupted, err := evaluate(done)
			if err != nil {
				return res, err
			}
			pending, stopping = interrupted, stopping || interrupted
			last = time.Now() // evaluation is not training time
		case saveEvery > 0 && done%saveEvery == 0 && done < steps:
			if err := checkpoint(done, false, nil); err != nil {
				return res, err
			}
			last = time.Now()
		}
		if stopping && (done < steps || pending) {
			bar.Done()
			res.Step, res.Interrupted, res.Elapsed = done, true, time.Since(start)
			return res, finish(done, pending)
		}
	}
	bar.Done()
	res.Step, res.Elapsed = step, time.Since(start)
	return res, finish(step, false)
}

// lossName is the plot's label of the loss.
func (m Metrics) lossName() string {
	if m.LossName == "" {
		return "loss"
	}
	return m.LossName
}

// mkdirRun makes the run directory dir when it does not exist; made says
// whether it did.
func mkdirRun(dir string) (made bool, err error) {
	if _, err := os.Stat(dir); err == nil {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("trainer: %w", err)
	}
	return true, nil
}

// gradCommNote is the data-parallel log line's word on the gradients'
// communication dtype.
func gradCommNote(dt tensor.DType) string {
	if dt == tensor.BF16 {
		return " in bf16 (cast from and back to the f32 gradients)"
	}
	return " in f32"
}

// bucketMiB is a bucket limit in MiB, for messages.
func bucketMiB(b int64) float64 { return float64(b) / (1 << 20) }
