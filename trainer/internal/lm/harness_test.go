package lm

import (
	"context"
	"io"

	"gpukit/libgpu/data"
	"gpukit/libgpu/device"
	"gpukit/libgpu/dist"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
	"gpukit/trainer/internal/driver"
)

// The language models the tests train: the GPT variant as models/gpt
// registers it, and a Mixture-of-Experts GPT logging its two loss terms
// as models/moe does (those packages import this one, so its tests
// cannot). RunLM trains the second when the configuration has MoE layers.
var (
	testVariant    = Variant{Name: "gpt", Summary: "GPT", Kind: "GPT", Default: DefaultConfig()}
	testMoEVariant = Variant{Name: "moe", Summary: "MoE GPT", Kind: "MoE GPT", Default: DefaultConfig(),
		Terms: func(s *nn.GPTStep) []driver.Term {
			aux, _ := s.AuxLosses.Rows(0, 1)
			z, _ := s.AuxLosses.Rows(1, 2)
			return []driver.Term{{Name: "aux_loss", T: aux}, {Name: "z_loss", T: z}}
		}}
)

func init() {
	Register(testVariant)
	Register(testMoEVariant)
}

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
	v := testVariant
	if cfg.Model.MoE != nil {
		v = testMoEVariant
	}
	t := &task{v: v, cfg: cfg}
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
	return driver.Run(ctx, t, driver.Options{Model: v.Name, Alloc: o.Alloc, Precision: o.Precision, Run: "", Out: o.Out,
		LogEvery: logEvery, Stdout: o.Stdout, Log: o.Log, Settings: driver.Settings{LogEvery: logEvery}, Resume: o.Resume,
		World: o.World, BucketBytes: o.BucketBytes, GradComm: o.GradComm, Buckets: o.buckets, Comm: o.comm,
		ShardOptimizer: o.Shard, LastBucketBytes: o.LastBucketBytes})
}
