package lm

import (
	"context"
	"io"

	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

// The language model the tests train: the GPT variant as models/gpt
// registers it (that package imports this one, so its tests cannot).
var testVariant = Variant{Name: "gpt", Summary: "GPT", Kind: "GPT", Default: DefaultConfig()}

func init() { Register(testVariant) }

func host() device.Allocator { return device.Local{Dev: device.NewHost()} }

// LMOptions are a test run's options: what the trainer's command line
// gives the driver (driver.Options) and the text.
type LMOptions struct {
	Alloc       device.Allocator
	Precision   ops.Precision
	Corpus      *data.Corpus // its tokenizer and text (DefaultTextPath) are what the run reads
	Out         string
	LogEvery    int
	Stdout      io.Writer
	Log         io.Writer
	Resume      *driver.Resume
	World       dist.World
	BucketBytes int64
	GradComm    tensor.DType
	// Shard is --shard-optimizer, LastBucketBytes --last-bucket-mb.
	Shard           bool
	LastBucketBytes int64
	buckets         bool
	comm            driver.Collective
}

// LMResult is how a test run ended.
type LMResult = driver.Result

// RunLM trains cfg as `trainer run --model gpt` does: the task loads the
// text (as this rank of o.World) and the driver runs it.
func RunLM(ctx context.Context, cfg Config, o LMOptions) (LMResult, error) {
	t := &task{v: testVariant, cfg: cfg}
	if t.cfg.Data == "" {
		t.cfg.Data = data.DefaultTextPath()
	}
	if o.Resume != nil {
		rc, tok, _, err := parseMeta(o.Resume.Stored.Meta)
		if err != nil {
			return LMResult{}, err
		}
		rc.Steps, rc.EvalEvery, rc.Data = cfg.Steps, cfg.EvalEvery, t.cfg.Data // the flags a resumed run may change
		t.cfg, t.tok = rc, tok
	}
	if err := t.Load(o.World); err != nil {
		return LMResult{}, err
	}
	logEvery := o.LogEvery
	if logEvery == 0 {
		logEvery = 1
	}
	return driver.Run(ctx, t, driver.Options{Model: testVariant.Name, Alloc: o.Alloc, Precision: o.Precision, Run: "", Out: o.Out,
		LogEvery: logEvery, Stdout: o.Stdout, Log: o.Log, Settings: driver.Settings{LogEvery: logEvery}, Resume: o.Resume,
		World: o.World, BucketBytes: o.BucketBytes, GradComm: o.GradComm, Buckets: o.buckets, Comm: o.comm,
		ShardOptimizer: o.Shard, LastBucketBytes: o.LastBucketBytes})
}
