package train

// Data-parallel training of the GPT (issue 14), as PyTorch's
// DistributedDataParallel does it (Li et al., "PyTorch Distributed:
// Experiences on Accelerating Data Parallel Training", VLDB 2020;
// torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/
// reducer.cpp): every rank holds the whole model, the parameters are
// broadcast from rank 0 at the start (and after a resume), each rank runs
// forward and backward on its rows of the global batch, and the
// gradients, laid out in buckets (dist.Plan: 25 MiB, the first 1 MiB, in
// the reverse of the parameters' order), are averaged across ranks by one
// in-place all-reduce per bucket as soon as the backward has written the
// bucket's last gradient (autograd.Tape.OnGradReady → nccl.Reducer.Ready),
// on a stream of their own (ops.Engine.CommSide), so the all-reduces
// overlap the rest of the backward, whose weight gradients run on the
// side stream; the step joins that stream before clipping and AdamW, which
// then run identically on every rank. With --grad-comm bf16
// (LMOptions.GradComm) the reducer casts each f32 bucket to bf16 around
// its all-reduce (nccl.Reducer.Compress, PyTorch DDP's
// bf16_compress_hook): half the bytes, the gradients rounded to bf16. The
// collectives are queued inside
// the step the runner captures as a CUDA graph (its first step is eager:
// NCCL connects its peers and the streams are made there), so a replay
// is one graph launch with the all-reduces as parallel branches (NCCL
// "Using NCCL with CUDA Graphs": collectives may be captured, and eager
// and captured collectives may share a communicator since NCCL 2.11).
//
// Data: the global batch of cfg.Batch sequences is drawn identically on
// every rank from (seed, step); rank r of n takes rows [r·b, (r+1)·b),
// b = cfg.Batch/n, so its loss is the mean over its b·block tokens; the
// average of equal shards' means is the global mean, and the average of
// their gradients is the gradient of the global mean: n ranks train as
// one process on the global batch does, up to the order of floating-point
// sums. Dropout numbers each rank's elements from r × the site's elements
// (ops.GraphOptions.Shard), so its masks are the one-process masks of the
// same rows. Evaluation: each rank takes its rows of every fixed
// validation batch and the mean losses are averaged across ranks.

import (
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nccl"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// collective is what a data-parallel run needs of its communicator:
// nccl.Comm's collectives, queued on the engine's stream. Tests put an
// in-process stand-in of several ranks on the host in its place.
type collective interface {
	nccl.Collective
	Rank() int
	Size() int
	BroadcastAll(e *ops.Engine, ts []*tensor.Tensor, root int) error
	Group(e *ops.Engine, fn func() error) error
}

var _ collective = (*nccl.Comm)(nil)

// dpConfig is how a model is spread over ranks: the communicator (Solo
// for one rank), the gradient buckets' sizes and the dtype the f32
// buckets travel in (gradComm: 0 or F32 as they are, BF16 compressed by
// the reducer, nccl.Reducer.Compress).
type dpConfig struct {
	comm     collective
	bucket   dist.BucketConfig
	gradComm tensor.DType
}

// bucketConfig is the bucket plan of a run with buckets of at most b
// bytes (0: dist.DefaultBucketBytes): the first bucket holds 1 MiB
// (dist.DefaultFirstBucketBytes), or b when that is smaller.
func bucketConfig(b int64) dist.BucketConfig {
	if b <= 0 {
		b = dist.DefaultBucketBytes
	}
	return dist.BucketConfig{Bytes: b, FirstBytes: min(b, dist.DefaultFirstBucketBytes)}
}

// localBatch is each rank's share of a global batch of b sequences.
func (d *dpConfig) localBatch(b int) (int, error) {
	n := d.comm.Size()
	if b%n != 0 {
		return 0, fmt.Errorf("%w: --batch %d does not divide by the world size %d (each rank takes --batch/%d rows of every global batch)",
			ErrConfig, b, n, n)
	}
	return b / n, nil
}

// lmDP is a training model's data-parallel state: its gradients in bucket
// buffers and the reducer that averages them during the backward.
type lmDP struct {
	comm     collective
	layout   *dist.Layout
	grads    *dist.Grads
	gradComm tensor.DType
	red      *nccl.Reducer
	// lossAvg, stop and stopAll: the logged loss averaged across ranks,
	// and this rank's stop flag (a step input) and every rank's maximum.
	lossAvg, stop, stopAll *tensor.Tensor
	bufs                   []*tensor.Tensor
}

// free releases the buckets and scalars.
func (d *lmDP) free() {
	if d.red != nil {
		d.red.Free()
	}
	for _, t := range d.bufs {
		t.Buf.Free()
	}
	if d.grads != nil {
		d.grads.Free()
	}
}

// newLMDP plans m's gradients in buckets (parameters in m.Params' order,
// the order of their first use in the forward, as DDP takes
// model.parameters()), allocates them and gives them to m (SetGrads).
func newLMDP(a device.Allocator, run string, m *nn.GPT, c *dpConfig) (*lmDP, error) {
	var ps []dist.Param
	for _, p := range m.Params() {
		ps = append(ps, dist.Param{Name: p.Name, DType: p.Value.DType, Shape: p.Value.Shape})
	}
	l, err := dist.Plan(ps, c.bucket)
	if err != nil {
		return nil, fmt.Errorf("gradient buckets: %w", err)
	}
	g, err := l.Alloc(a, join(run, "grads/buckets"))
	if err != nil {
		return nil, err
	}
	if err := m.SetGrads(g.Params); err != nil {
		g.Free()
		return nil, err
	}
	return &lmDP{comm: c.comm, layout: l, grads: g, gradComm: c.gradComm}, nil
}

// attach makes the reducer and hooks it to the training graph's tape: a
// parameter's gradient is marked ready as soon as the backward has queued
// its last write (a bucket's all-reduce then starts on the communication
// stream). With gradComm BF16 the reducer casts each f32 bucket to a bf16
// staging copy (allocated here, once), averages that and casts it back.
// It also allocates the scalars of the loss report and the stop flag.
func (d *lmDP) attach(e *ops.Engine, a device.Allocator, run string, m *nn.GPT, g *ops.Graph) error {
	var err error
	if d.red, err = nccl.NewReducer(e, d.comm, d.layout, d.grads, nccl.Avg); err != nil {
		return err
	}
	if d.gradComm == tensor.BF16 {
		if err := d.red.Compress(a, join(run, "grads/comm_bf16"), tensor.BF16); err != nil {
			return err
		}
	}
	idx := map[string]int{}
	for i, p := range m.Params() {
		idx[p.Name] = i
	}
	g.Tape().OnGradReady(func(v *ops.Var) error {
		i, ok := idx[v.Name]
		if !ok {
			return fmt.Errorf("train: %s is not a parameter of the model", v.Name)
		}
		return d.red.Ready(i)
	})
	for _, t := range []struct {
		p    **tensor.Tensor
		name string
	}{{&d.lossAvg, "acts/loss_avg"}, {&d.stop, "acts/stop"}, {&d.stopAll, "acts/stop_all"}} {
		if *t.p, err = tensor.Alloc(a, join(run, t.name), tensor.F32, 1); err != nil {
			return err
		}
		d.bufs = append(d.bufs, *t.p)
	}
	return nil
}
