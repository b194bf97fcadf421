package hrm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data/sudoku"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/trace"
	"gpukit/trainer/internal/driver"
)

// Files of a data directory (`trainer data sudoku --out DIR`).
const (
	TrainFile = "train.safetensors"
	TestFile  = "test.safetensors"
)

// Checkpoint layout beyond model.safetensors's tensors (hrm.py's names):
// the state file holds AdamATan2's state under optimPrefix (its names:
// "<param>.exp_avg", "<param>.exp_avg_sq", "step") and the carried state
// of nn.HRMTrain.Carry under its names (carry.z_H, ...), with metadata
// metaVisits, the training puzzles drawn so far.
const (
	optimPrefix = "optim/"
	metaVisits  = "data_visits"
)

// task is an HRM run on a Sudoku data directory (driver.Task).
type task struct {
	cfg Config
	// After Load: the training set (after --limit) and the test tokens of
	// the evaluations (the first --eval-n puzzles).
	train           *sudoku.Set
	testIn, testLab []uint8
	trainSrc        string
}

func newTask(cfg Config) (*task, error) { return &task{cfg: cfg}, nil }

func (t *task) Config() any { return t.cfg }
func (t *task) Steps() int  { return t.cfg.Steps }

// Load reads DIR/train.safetensors and DIR/test.safetensors (checked by
// libgpu/data/sudoku: format, shapes, every label a solution).
func (t *task) Load(dist.World) error {
	if st, err := os.Stat(t.cfg.Data); err != nil || !st.IsDir() {
		return driver.Configf("--data %s: not a directory of trainer data sudoku (%v)", t.cfg.Data, statErr(err))
	}
	train, err := sudoku.Load(filepath.Join(t.cfg.Data, TrainFile))
	if err != nil {
		return fmt.Errorf("--data: %w", err)
	}
	test, err := sudoku.Load(filepath.Join(t.cfg.Data, TestFile))
	if err != nil {
		return fmt.Errorf("--data: %w", err)
	}
	return t.setData(train, test)
}

// setData takes the sets (Load's, or a test's).
func (t *task) setData(train, test *sudoku.Set) error {
	if train.Len() == 0 {
		return driver.Configf("--data %s: the training set is empty", t.cfg.Data)
	}
	if test.Len() == 0 {
		return driver.Configf("--data %s: the test set is empty (the run evaluates on it)", t.cfg.Data)
	}
	if n := t.cfg.Limit; n > 0 && n < train.Len() {
		train = &sudoku.Set{Inputs: train.Inputs[:n], Labels: train.Labels[:n], Meta: train.Meta}
	}
	t.train = train
	n := test.Len()
	if t.cfg.EvalN > 0 {
		n = min(n, t.cfg.EvalN)
	}
	t.testIn, t.testLab = tokens(test.Inputs[:n]), tokens(test.Labels[:n])
	t.trainSrc = train.Meta["source"]
	return nil
}

func statErr(err error) any {
	if err == nil {
		return "a file"
	}
	return err
}

// tokens are the model's tokens of grids (digit + 1: nn.HRMTokens), row-major.
func tokens(gs []sudoku.Grid) []uint8 {
	out := make([]uint8, 0, len(gs)*sudoku.Cells)
	for i := range gs {
		for _, v := range gs[i] {
			out = append(out, v+1)
		}
	}
	return out
}

// sampler draws the run's batches (libgpu/data/sudoku.Sampler: the same
// draws as `trainer data replay --seed DataSeed --num-aug NumAug`).
func (t *task) sampler() sudoku.Sampler {
	c := t.cfg
	return sudoku.Sampler{N: t.train.Len(), Batch: c.Batch, Seed: c.DataSeed, Aug: sudoku.Augmenter{Seed: c.DataSeed, NumAug: c.NumAug}}
}

// Init is the HRM's initial weights (nn.NewHRM with --seed).
func (t *task) Init(a device.Allocator) (driver.Checkpoint, error) {
	m, err := nn.NewHRM(a, "init", t.cfg.HRMConfig, false, t.cfg.Seed)
	if err != nil {
		return driver.Checkpoint{}, driver.Configf("%v", err)
	}
	defer m.Free()
	entries, err := driver.Entries("", params(m))
	return driver.Checkpoint{Model: entries}, err
}

// params are the model's tensors under hrm.py's names, in its order.
func params(m *nn.HRM) []ckpt.Named {
	var out []ckpt.Named
	for _, p := range m.Params() {
		out = append(out, ckpt.Named{Name: p.Name, T: p.Value})
	}
	return out
}

func (t *task) Build(env *driver.Env) (driver.Trainer, error) {
	c := t.cfg
	r := &trainer{t: t, e: env.Engine, graph: env.Graph, samp: t.sampler(),
		inputs: make([]sudoku.Grid, c.Batch), labels: make([]sudoku.Grid, c.Batch),
		tin: make([]uint8, c.Batch*sudoku.Cells), tlab: make([]uint8, c.Batch*sudoku.Cells)}
	ok := false
	defer func() {
		if !ok {
			r.Free()
		}
	}()
	var err error
	if r.m, err = nn.NewHRM(env.Alloc, env.Run, c.HRMConfig, true, c.Seed); err != nil {
		return nil, fmt.Errorf("building the model: %w", err)
	}
	dt := tensor.F32
	if env.Precision == ops.PrecBF16 && env.Engine.IsGraphCapable() {
		dt = tensor.BF16
	}
	if r.tr, err = r.m.NewTrain(env.Engine, env.Alloc, env.Run, nn.HRMTrainConfig{Batch: c.Batch, Autocast: dt,
		Warmup: c.Warmup, TotalSteps: c.Steps, LRMinRatio: c.LRMinRatio, Graph: env.Graph}); err != nil {
		return nil, fmt.Errorf("building the segment step: %w", err)
	}
	if r.adam, err = optim.NewAdamATan2(env.Alloc, env.Run, r.m.AdamParams(), ops.AdamATan2Config{LR: c.LR, Beta1: c.Beta1,
		Beta2: c.Beta2, WeightDecay: c.WeightDecay, LRScale: r.tr.LRScale()}); err != nil {
		return nil, fmt.Errorf("building the optimizer: %w", err)
	}
	sign, err := optim.NewSignSGD(r.m.SignParams(), ops.SignSGDConfig{LR: c.PuzzleEmbLR, WeightDecay: c.PuzzleEmbWeightDecay,
		LRScale: r.tr.LRScale()})
	if err != nil {
		return nil, fmt.Errorf("building the optimizer: %w", err)
	}
	r.tr.SetOptimizers(r.adam, sign)
	if r.ev, err = r.tr.Evaluator(env.Alloc, env.Run+"/eval"); err != nil {
		return nil, fmt.Errorf("building the evaluation: %w", err)
	}
	if env.Log != nil {
		fmt.Fprintf(env.Log, "trainer: sudoku: %d training puzzles (%s) × %d augmented copies each, batches, augmentation and exploration drawn with data seed %d; %d test puzzles per evaluation\n",
			t.train.Len(), t.trainSrc, c.NumAug, c.DataSeed, len(t.testIn)/sudoku.Cells)
	}
	ok = true
	return r, nil
}

func (t *task) Summary(r driver.Result, model string) string {
	if !r.Trained {
		return fmt.Sprintf("nothing to do: the checkpoint already has %d steps (raise --steps)", r.Step)
	}
	s := fmt.Sprintf("%d segment steps in %.1fs; last loss %.4f", r.Step, r.Elapsed.Seconds(), r.Loss)
	if r.Eval != nil {
		for _, f := range r.Eval.Fields {
			switch f.Key {
			case "test_exact_accuracy":
				s += fmt.Sprintf("; test exact accuracy %.4f", f.Value)
			case "test_cell_accuracy":
				s += fmt.Sprintf(", cell accuracy %.4f", f.Value)
			case "test_mean_segments":
				s += fmt.Sprintf(", mean segments %.2f", f.Value)
			}
		}
	}
	dir := filepath.Dir(model)
	return s + fmt.Sprintf("; wrote %s (solve with: trainer solve --ckpt %s)", model, dir)
}

// trainer is the HRM on a device (driver.Trainer, Evaluator, Saver): its
// segment step (nn.HRMTrain, which replays itself as one CUDA graph) with
// AdamATan2 and sign-SGD, and an evaluation sharing the step's core.
type trainer struct {
	t     *task
	e     *ops.Engine
	graph bool
	m     *nn.HRM
	tr    *nn.HRMTrain
	adam  *optim.AdamATan2
	ev    *nn.HRMEval
	samp  sudoku.Sampler
	first int // the step this process started at (its first step runs eagerly)
	// Fill's buffers.
	inputs, labels []sudoku.Grid
	tin, tlab      []uint8
}

func (r *trainer) Describe() string {
	c := r.t.cfg
	return fmt.Sprintf("HRM of %.2fM parameters (hidden %d, %d heads, %d+%d layers, %d×%d cycles, at most %d segments; batch %d)",
		float64(r.m.NumParams())/1e6, c.Hidden, c.Heads, c.HLayers, c.LLayers, c.HCycles, c.LCycles, c.HaltMaxSteps, c.Batch)
}

// Inputs: none through the driver's staging. Fill stages each step's
// batch into nn.HRMTrain's own pool of device batches (pinned staging,
// queued in order with the steps), which the step reads on the device
// for the sequences that halted.
func (r *trainer) Inputs() []*tensor.Tensor { return nil }

// Fill stages step's batch: the sampler's puzzles and augmentation copies
// of the step and its exploration draws (all functions of the data seed
// and the step), as tokens.
func (r *trainer) Fill(step int, _ [][]byte) error {
	mh := r.t.batch(r.samp, step, r.inputs, r.labels, r.tin, r.tlab)
	return r.tr.Stage(step, r.tin, r.tlab, mh)
}

// batch draws step's batch into inputs and labels (Batch grids each) and
// their tokens tin, tlab (Batch·81 each), and returns the step's
// exploration draws: what `trainer data replay --seed DataSeed --num-aug
// NumAug` writes for the step.
func (t *task) batch(s sudoku.Sampler, step int, inputs, labels []sudoku.Grid, tin, tlab []uint8) []int32 {
	c := t.cfg
	s.Fill(t.train, step, inputs, labels)
	for j := range inputs {
		for i := 0; i < sudoku.Cells; i++ {
			tin[j*sudoku.Cells+i] = inputs[j][i] + 1
			tlab[j*sudoku.Cells+i] = labels[j][i] + 1
		}
	}
	return sudoku.MinHaltSteps(c.DataSeed, step, c.Batch, c.HaltExplorationProb, c.HaltMaxSteps)
}

// Compute queues one segment step: nn.HRMTrain.Run, eager for its first
// step and then, with --graph on a GPU, one replay of the step captured
// as a CUDA graph. The driver does not capture it (Capturable): the step
// keeps its own graph and step counter.
func (r *trainer) Compute(gt *trace.GPUTimer) error {
	name := driver.SpanForward // an eager step: forward, backward and optimizers queued as one
	if r.graph && r.e.IsGraphCapable() && r.tr.Queued() > r.first {
		name = driver.SpanReplay
	}
	p := driver.BeginPhase(gt, name)
	err := r.tr.Run()
	p.End()
	return err
}

func (r *trainer) Capturable() bool { return false }

// Metrics: hrm.py's per-step fields, read from the step's metrics vector
// on the device when a loss line is written.
func (r *trainer) Metrics() driver.Metrics {
	v := r.tr.MetricsVector()
	at := func(i int) *tensor.Tensor {
		x, err := v.Narrow(0, i, 1)
		if err != nil {
			panic(err) // a view of a vector of ops.ACTMetrics entries: cannot fail
		}
		return x
	}
	var terms []driver.Term
	for _, tm := range []struct {
		name string
		i    int
	}{{"lm_loss", ops.ACTLMLoss}, {"q_halt_loss", ops.ACTQHaltLoss}, {"q_continue_loss", ops.ACTQContinueLoss},
		{"count", ops.ACTCount}, {"accuracy", ops.ACTAccuracy}, {"exact_accuracy", ops.ACTExactAccuracy},
		{"q_halt_accuracy", ops.ACTQHaltAccuracy}, {"steps", ops.ACTSteps}, {"halted", ops.ACTCount}} {
		terms = append(terms, driver.Term{Name: tm.name, T: at(tm.i)})
	}
	return driver.Metrics{Loss: at(ops.ACTLoss), Terms: terms, Unit: "sequences", Items: float64(r.t.cfg.Batch),
		FLOPs: r.t.cfg.SegmentFLOPs(), LogFinal: true, LossName: "stablemax cross-entropy + ½ Q losses"}
}

func (r *trainer) LR(step int) float32 { return r.t.cfg.LR * float32(r.t.cfg.LRScale(step)) }

// Checkpoint: the model's tensors under hrm.py's names (Model), then
// AdamATan2's state and the carried state (State).
func (r *trainer) Checkpoint(step int) (driver.Checkpoint, error) {
	var ck driver.Checkpoint
	if err := r.e.Sync(); err != nil {
		return ck, err
	}
	var err error
	if ck.Model, err = driver.Entries("", params(r.m)); err != nil {
		return ck, err
	}
	var st []ckpt.Named
	for _, s := range r.adam.State() {
		st = append(st, ckpt.Named{Name: optimPrefix + s.Name, T: s.Value})
	}
	st = append(st, r.tr.Carry()...)
	if ck.State, err = driver.Entries("", st); err != nil {
		return ck, err
	}
	ck.StateMeta = map[string]string{metaVisits: strconv.Itoa(step * r.t.cfg.Batch)}
	return ck, nil
}

// Load restores the weights, AdamATan2's state and the carried state
// from a state file; the step goes on from the file's.
func (r *trainer) Load(f *ckpt.File) error {
	step, err := strconv.Atoi(f.Metadata[driver.MetaStep])
	if err != nil || step < 0 {
		return fmt.Errorf("%w: step %q", driver.ErrCheckpoint, f.Metadata[driver.MetaStep])
	}
	for _, p := range r.m.Params() {
		if err := f.Load(p.Name, p.Value); err != nil {
			return fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
	}
	for _, s := range r.adam.State() {
		if err := f.Load(optimPrefix+s.Name, s.Value); err != nil {
			return fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
	}
	if err := r.tr.Reset(step); err != nil {
		return err
	}
	for _, c := range r.tr.Carry() {
		if err := loadAs(f, c.Name, c.T); err != nil {
			return fmt.Errorf("%w: %v", driver.ErrCheckpoint, err)
		}
	}
	r.first = step
	return nil
}

// loadAs loads a tensor, converting f32 and bf16 into each other (the
// carried hidden states are in the compute dtype, which a resumed run's
// --precision may change).
func loadAs(f *ckpt.File, name string, t *tensor.Tensor) error {
	info, b, err := f.Bytes(name)
	if err != nil {
		return err
	}
	float := func(dt tensor.DType) bool { return dt == tensor.F32 || dt == tensor.BF16 }
	if info.DType == t.DType || !float(info.DType) || !float(t.DType) || !tensor.SameShape(info.Shape, t.Shape) {
		return f.Load(name, t)
	}
	v := make([]float32, t.Numel())
	for i := range v {
		if info.DType == tensor.F32 {
			v[i] = tensor.BytesAs[float32](b)[i]
		} else {
			v[i] = tensor.BF16ToF32(tensor.BytesAs[uint16](b)[i])
		}
	}
	return t.WriteFloat32(v)
}

func (r *trainer) Free() {
	if r.ev != nil {
		r.ev.Free()
	}
	if r.adam != nil {
		r.adam.Free()
	}
	if r.tr != nil {
		r.tr.Free()
	}
	if r.m != nil {
		r.m.Free()
	}
}

func (r *trainer) EvalEvery() int { return r.t.cfg.EvalEvery }
func (r *trainer) SaveEvery() int { return r.t.cfg.SaveEvery }

// Eval evaluates the first --eval-n test puzzles with halting (on a GPU
// with --graph on, each batch one replay of the captured evaluation whose
// segment loop is a conditional WHILE node). Its validation loss, by
// which best.safetensors is kept, is 1 − exact accuracy + 1e-6·(1 − cell
// accuracy): the highest exact accuracy, ties broken by cell accuracy
// (the cell term is below the exact term's step 1/N for N < 10⁶).
func (r *trainer) Eval(ctx context.Context, step int, elapsed time.Duration) (driver.Eval, error) {
	if err := ctx.Err(); err != nil {
		return driver.Eval{}, err
	}
	res, err := r.ev.Evaluate(r.t.testIn, r.t.testLab, nn.HRMEvalOptions{Halting: true, Graph: r.graph})
	if err != nil {
		return driver.Eval{}, fmt.Errorf("evaluating after step %d: %w", step, err)
	}
	return driver.Eval{
		Fields: []driver.Field{{Key: "test_exact_accuracy", Value: res.ExactAccuracy}, {Key: "test_cell_accuracy", Value: res.CellAccuracy},
			{Key: "test_mean_segments", Value: driver.Round(res.MeanSegments, 4)}, {Key: "test_puzzles", Value: res.Puzzles},
			{Key: "elapsed_s", Value: driver.Round(elapsed.Seconds(), 3)}},
		ValLoss: (1 - res.ExactAccuracy) + 1e-6*(1-res.CellAccuracy),
	}, nil
}
