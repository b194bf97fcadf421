package driver

// Data-parallel training (issue 14), as PyTorch's DistributedDataParallel
// does it (Li et al., "PyTorch Distributed: Experiences on Accelerating
// Data Parallel Training", VLDB 2020; torch/nn/parallel/distributed.py and
// torch/csrc/distributed/c10d/reducer.cpp). The driver owns the parts
// every model shares: the communicator (NCCL, met through
// dist.Rendezvous), the broadcast of rank 0's parameters and optimizer
// state at the start (and after a resume), the loss of a logged step
// averaged across ranks, and the agreement to stop (a SIGTERM that reaches
// one rank stops every rank at the same step). A model that registers with
// DataParallel builds, in Task.Build with Env.DP set, its gradients in
// bucket buffers (NewGradBuckets: dist.Plan's buckets, 25 MiB, the first
// 1 MiB, in the reverse of the parameters' order), hooks them to its
// tape (GradBuckets.Attach: one in-place all-reduce per bucket as soon as
// the backward has written the bucket's last gradient, on a stream of its
// own, overlapping the rest of the backward) and joins them (Wait) before
// clipping and the optimizer, which then run identically on every rank.
// With --grad-comm bf16 the reducer casts each f32 bucket to bf16 around
// its all-reduce (nccl.Reducer.Compress, PyTorch DDP's
// bf16_compress_hook). The collectives are queued inside the step the
// runner captures as a CUDA graph (its first step is eager: NCCL connects
// its peers and the streams are made there), so a replay is one graph
// launch with the all-reduces as parallel branches (NCCL "Using NCCL with
// CUDA Graphs": collectives may be captured, and eager and captured
// collectives may share a communicator since NCCL 2.11). Each rank fills
// its rows of every global batch (Env.World, DP.LocalBatch), so its loss
// is the mean over its rows, and the average of equal shards' means is
// the global mean.
//
// With --shard-optimizer (DP.Shard, issue 27) the run is ZeRO stage 1
// (libgpu/zero; Rajbhandari et al., "ZeRO", arXiv 1910.02054, §5.1): the
// buckets are cut into one part per rank (dist.BucketConfig.Shards), the
// parameters move into bucket storage laid out like the gradients
// (NewGradBuckets' setParams), the reducer reduce-scatters each bucket
// where it would all-reduce it (nccl.Reducer.Scatter), and the model's
// AdamW is GradBuckets.NewAdamW's zero.AdamW: the moments of this rank's
// parts only, the global norm for clipping, the update of its parts and
// one all-gather per parameter bucket, all inside the captured step. A
// checkpoint gathers the state on rank 0 (StateGatherer, every rank), so
// the files are those of an unsharded run and a run resumes at any world
// size, sharded or not.

import (
	"fmt"

	"gpukit/libgpu/autograd"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/libgpu/zero"
)

// Collective is what a data-parallel run needs of its communicator:
// nccl.Comm's collectives, queued on the engine's stream (reduce-scatter,
// all-gather and broadcast too: zero.Collective, for --shard-optimizer).
// Tests put nccltest.World's in-process stand-in of several ranks on the
// host in its place (Options.Comm).
type Collective interface {
	zero.Collective
	BroadcastAll(e *ops.Engine, ts []*tensor.Tensor, root int) error
}

var _ Collective = (*nccl.Comm)(nil)

// DP is how a model is spread over ranks (Env.DP; nil: a process alone):
// the communicator (nccl.Solo for one rank with buckets), the gradient
// buckets' sizes and the dtype the f32 buckets travel in (GradComm: 0 or
// F32 as they are, BF16 compressed by the reducer, nccl.Reducer.Compress),
// and Shard: ZeRO-1, the optimizer state split across the ranks
// (--shard-optimizer; set only for several ranks).
type DP struct {
	Comm     Collective
	Bucket   dist.BucketConfig
	GradComm tensor.DType
	Shard    bool
}

// BucketConfig is the bucket plan of a run with buckets of at most b
// bytes (0: dist.DefaultBucketBytes): the first bucket holds 1 MiB
// (dist.DefaultFirstBucketBytes), or b when that is smaller.
func BucketConfig(b int64) dist.BucketConfig {
	if b <= 0 {
		b = dist.DefaultBucketBytes
	}
	return dist.BucketConfig{Bytes: b, FirstBytes: min(b, dist.DefaultFirstBucketBytes)}
}

// LocalBatch is each rank's share of a global batch of b rows.
func (d *DP) LocalBatch(b int) (int, error) {
	n := d.Comm.Size()
	if b%n != 0 {
		return 0, Configf("--batch %d does not divide by the world size %d (each rank takes --batch/%d rows of every global batch)", b, n, n)
	}
	return b / n, nil
}

// GradBuckets is a training model's data-parallel state: its gradients in
// bucket buffers and the reducer that averages them during the backward;
// with DP.Shard, its parameters in bucket storage too and the sharded
// AdamW (NewAdamW).
type GradBuckets struct {
	comm     Collective
	layout   *dist.Layout
	grads    *dist.Grads
	params   *dist.Grads // the parameters' bucket storage (DP.Shard), else nil
	gradComm tensor.DType
	red      *nccl.Reducer
	opt      *zero.AdamW // NewAdamW's, for the log line
}

// NewGradBuckets plans the gradients of params in buckets (in params'
// order, which should be the order of their first use in the forward, as
// DDP takes model.parameters()), allocates them and gives them to the
// model through setGrads (parameter i's gradient, a view of its bucket).
// With d.Shard it cuts every bucket into d.Comm.Size() parts, allocates
// the parameters' storage laid out like the gradients ("params/buckets")
// and moves the model's parameters there through setParams (nn.GPT's
// SetParams; call before recording any graph of the model): ZeRO-1's
// all-gather then updates them in place. A model without setParams (nil)
// cannot shard: ErrConfig.
func NewGradBuckets(a device.Allocator, run string, params []nn.Param, setParams, setGrads func([]*tensor.Tensor) error,
	d *DP) (b *GradBuckets, err error) {
	var ps []dist.Param
	for _, p := range params {
		ps = append(ps, dist.Param{Name: p.Name, DType: p.Value.DType, Shape: p.Value.Shape})
	}
	cfg := d.Bucket
	if d.Shard {
		if setParams == nil {
			return nil, Configf("--shard-optimizer: the model cannot keep its parameters in bucket storage")
		}
		cfg.Shards = d.Comm.Size()
	}
	l, err := dist.Plan(ps, cfg)
	if err != nil {
		return nil, fmt.Errorf("gradient buckets: %w", err)
	}
	b = &GradBuckets{comm: d.Comm, layout: l, gradComm: d.GradComm}
	defer func() {
		if err != nil {
			b.Free()
			b = nil
		}
	}()
	if b.grads, err = l.Alloc(a, Join(run, "grads/buckets")); err != nil {
		return b, err
	}
	if d.Shard {
		if b.params, err = l.Alloc(a, Join(run, "params/buckets")); err != nil {
			return b, err
		}
		if err := setParams(b.params.Params); err != nil {
			return b, err
		}
	}
	if err := setGrads(b.grads.Params); err != nil {
		return b, err
	}
	return b, nil
}

// Layout is the buckets' plan.
func (b *GradBuckets) Layout() *dist.Layout { return b.layout }

// Grads are the bucket buffers.
func (b *GradBuckets) Grads() *dist.Grads { return b.grads }

// Sharded reports whether the buckets are ZeRO-1's (DP.Shard).
func (b *GradBuckets) Sharded() bool { return b.params != nil }

// ParamBuckets are the parameters' bucket buffers (DP.Shard; nil
// otherwise): what rank 0 broadcasts at the start instead of each
// parameter and the optimizer state.
func (b *GradBuckets) ParamBuckets() []*tensor.Tensor {
	if b.params == nil {
		return nil
	}
	return b.params.Buckets
}

// NewAdamW is the sharded AdamW of these buckets (DP.Shard):
// zero.NewAdamW over the parameters' and gradients' bucket storage, its
// state named under run. cfg's NoDecay has one entry per parameter (in
// NewGradBuckets' params order); GradScale, when set, is the clipping
// coefficient its ClipCoef writes. The caller frees it.
func (b *GradBuckets) NewAdamW(a device.Allocator, run string, cfg ops.AdamWConfig) (*zero.AdamW, error) {
	if b.params == nil {
		return nil, fmt.Errorf("trainer: a sharded AdamW over buckets made without DP.Shard")
	}
	z, err := zero.NewAdamW(a, run, b.comm, b.layout, b.params, b.grads, cfg)
	if err != nil {
		return nil, fmt.Errorf("building the sharded optimizer: %w", err)
	}
	b.opt = z
	return z, nil
}

// Attach makes the reducer and hooks it to the training graph's tape: a
// parameter's gradient is marked ready as soon as the backward has queued
// its last write (a bucket's all-reduce then starts on the communication
// stream). With GradComm BF16 the reducer casts each f32 bucket to a bf16
// staging copy (allocated here, once), averages that and casts it back.
// Sharded buckets are reduce-scattered instead (nccl.Reducer.Scatter):
// after Wait this rank holds the averaged gradients of its parts.
func (b *GradBuckets) Attach(e *ops.Engine, a device.Allocator, run string, params []nn.Param, tape *autograd.Tape) error {
	var err error
	if b.red, err = nccl.NewReducer(e, b.comm, b.layout, b.grads, nccl.Avg); err != nil {
		return err
	}
	if b.Sharded() {
		if err := b.red.Scatter(true); err != nil {
			return err
		}
	}
	if b.gradComm == tensor.BF16 {
		if err := b.red.Compress(a, Join(run, "grads/comm_bf16"), tensor.BF16); err != nil {
			return err
		}
	}
	idx := map[string]int{}
	for i, p := range params {
		idx[p.Name] = i
	}
	tape.OnGradReady(func(v *ops.Var) error {
		i, ok := idx[v.Name]
		if !ok {
			return fmt.Errorf("trainer: %s is not a parameter of the model", v.Name)
		}
		return b.red.Ready(i)
	})
	return nil
}

// Wait queues the last buckets' all-reduces and the join of their stream:
// clipping and the optimizer after it see averaged gradients.
func (b *GradBuckets) Wait() error { return b.red.Wait() }

// Free releases the reducer and the buckets (the parameters' too: free
// the model's graphs first; the sharded AdamW is the caller's).
func (b *GradBuckets) Free() {
	if b.red != nil {
		b.red.Free()
	}
	if b.grads != nil {
		b.grads.Free()
	}
	if b.params != nil {
		b.params.Free()
	}
}

// shareNote is the data-parallel log line's word on how the gradients
// are reduced and, sharded, on the optimizer state.
func (b *GradBuckets) shareNote(dt tensor.DType) string {
	if !b.Sharded() {
		return "averaged during the backward" + gradCommNote(dt)
	}
	s := "reduce-scattered during the backward" + gradCommNote(dt) + "; optimizer state sharded (ZeRO-1)"
	if b.opt != nil {
		s += fmt.Sprintf(": %.3g MiB of AdamW state on this rank, 1/%d", float64(b.opt.StateBytes())/(1<<20), b.comm.Size())
	}
	return s + ", parameters all-gathered after each update"
}

// dpRun is the driver's part of a data-parallel run: the logged loss and
// loss terms averaged across ranks, and this rank's stop flag (a step
// input) and every rank's maximum of it.
type dpRun struct {
	comm                   Collective
	lossAvg, stop, stopAll *tensor.Tensor
	termsAvg               []*tensor.Tensor // one [1] f32 per Metrics.Terms
}

func newDPRun(a device.Allocator, run string, comm Collective, terms int) (*dpRun, error) {
	d := &dpRun{comm: comm, termsAvg: make([]*tensor.Tensor, terms)}
	ps := []**tensor.Tensor{&d.lossAvg, &d.stop, &d.stopAll}
	names := []string{"acts/loss_avg", "acts/stop", "acts/stop_all"}
	for i := range d.termsAvg {
		ps, names = append(ps, &d.termsAvg[i]), append(names, fmt.Sprintf("acts/term_avg%d", i))
	}
	for i, p := range ps {
		var err error
		if *p, err = tensor.Alloc(a, Join(run, names[i]), tensor.F32, 1); err != nil {
			d.free()
			return nil, err
		}
	}
	return d, nil
}

func (d *dpRun) free() {
	for _, t := range append([]*tensor.Tensor{d.lossAvg, d.stop, d.stopAll}, d.termsAvg...) {
		if t != nil {
			t.Buf.Free()
		}
	}
}

// agree averages loss and the terms across ranks and takes the maximum of
// the ranks' stop flags: the loss of the whole global batch (the mean of
// equal shards' means), each term's mean over the ranks (a term that is a
// mean over tokens, such as a z-loss, is then the global batch's; one
// that is not linear in the batch, such as a load-balancing loss, is the
// mean of the ranks' own), and whether any rank was signalled.
func (d *dpRun) agree(e *ops.Engine, loss *tensor.Tensor, terms []Term) (float32, []float32, bool, error) {
	err := d.comm.Group(e, func() error {
		if err := d.comm.AllReduce(e, d.lossAvg, loss, nccl.Avg); err != nil {
			return err
		}
		for i, t := range terms {
			if err := d.comm.AllReduce(e, d.termsAvg[i], t.T, nccl.Avg); err != nil {
				return err
			}
		}
		return d.comm.AllReduce(e, d.stopAll, d.stop, nccl.Max)
	})
	if err != nil {
		return 0, nil, false, err
	}
	v, err := d.lossAvg.ReadF32()
	if err != nil {
		return 0, nil, false, err
	}
	tv := make([]float32, len(terms))
	for i := range terms {
		x, err := d.termsAvg[i].ReadF32()
		if err != nil {
			return 0, nil, false, err
		}
		tv[i] = x[0]
	}
	s, err := d.stopAll.ReadF32()
	if err != nil {
		return 0, nil, false, err
	}
	return v[0], tv, s[0] > 0, nil
}
