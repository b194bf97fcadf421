// Package bench holds gpukit's benchmarks, run on a GPU machine from the
// GPU bundle (make gpu-bundle; build/gpu/run.sh bench/SCRIPT or
// bench/BINARY) and written up in BENCHMARKS.md:
//
//   - cmd/gpukit-bench runs each workload of workloads.json (kernels,
//     GEMMs, attention, compiles) and reference/*.py runs the same workload
//     in PyTorch; run.sh alternates the two and writes
//     results/<date>-<gpu>.json, which report.py turns into tables;
//   - cmd/gpukit-trainbench times the trainer's MLP step
//     (reference/trainstep.sh beside PyTorch's), cmd/gpukit-poolbench the
//     pool daemon, cmd/gpukit-allreduce NCCL collectives as nccl-tests
//     does, cmd/gpukit-optimplot plots optimizer comparisons and
//     cmd/gpukit-tf32newton emulates TF32 Newton iterations on the CPU;
//   - the *.sh scripts drive whole runs: gpt.sh, unet.sh, moe.sh (models
//     beside their PyTorch references), dp.sh, dp-sweep.sh and scale.sh
//     (data parallel), optim-*.sh and roots.sh (optimizers), first-run.sh
//     (compile cost of a first run), conv.sh (the convolution table beside
//     cuDNN) and attention-kernels.sh (the attention forward kernels'
//     registers, spills and timings per path, and ncu with NCU=1).
package bench
