// Package devflag is the part of the CLI layer (libgpu/cli) that says where
// a tool computes: the flags --device, --pool, --precision and --graph,
// each defined once here (name, usage, default, check), and Open, the one
// function that opens the allocator they name: the gpupool daemon at
// --pool, or the device --device names in this process. The trainer, the
// sampler and the optimizer take them from here.
//
// It is a package of its own, not part of libgpu/cli, because it imports
// the compute stack (device, ops, pool): a tool that computes nothing
// (the tracer, which must link no CUDA) uses libgpu/cli alone.
//
// A value is checked when its flag is parsed, before the command runs, as
// libgpu/cli checks numeric flags: a bad one is a usage error (exit 2)
// naming the flag and the value ("--graph \"maybe\": want on or off").
// The readers (PrecisionOf, GraphOn, Open) check again, for values that
// did not come from the command line (a model's default).
package devflag
