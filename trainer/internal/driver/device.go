package driver

import (
	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cli/devflag"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
)

// traceFlag is --trace of every command that runs a model.
var traceFlag = kit.TraceFlag("spans (step, data, forward, backward, optimizer, graph replay, evaluation, checkpoint) and GPU times")

// DeviceFlags are --pool, --device, --graph (of graphWhat), --precision
// (libgpu/cli/devflag) and --trace: what a command that runs a model
// takes (NewInput reads them).
func DeviceFlags(graphWhat string) []cli.Flag {
	return []cli.Flag{
		devflag.Pool("allocate through the gpupool daemon at SOCK instead of in-process"),
		devflag.Device(),
		devflag.Graph(graphWhat),
		devflag.Precision(ops.PrecTF32, "the model's GEMMs (bf16: activations too, with f32 master weights)"),
		traceFlag,
	}
}

// NewInput reads the flags of DeviceFlags (usage errors, before any
// work) and returns the command's Input for the checkpoint file ckpt
// (may be empty); its Alloc opens --pool or --device when called
// (devflag.Open).
func NewInput(c *cli.Context, ckpt string) (*Input, error) {
	prec, err := devflag.PrecisionOf(c)
	if err != nil {
		return nil, err
	}
	graph, err := devflag.GraphOn(c)
	if err != nil {
		return nil, err
	}
	return &Input{Ckpt: ckpt, Precision: prec, Graph: graph,
		Alloc: func() (device.Allocator, func(), error) { return devflag.Open(c) }}, nil
}

// Reserved are the names of the driver's flags (run, eval, generate,
// init): a model's flags may not take them.
var Reserved = []string{"model", "out", "force", "data", "resume", "log-every", "pool", "run", "device", "graph", "precision",
	"trace", "bucket-mb", "grad-comm", "shard-optimizer", "last-bucket-mb", "comm-priority", "nccl-min-ctas", "nccl-max-ctas",
	"ckpt", "help", "h"}
