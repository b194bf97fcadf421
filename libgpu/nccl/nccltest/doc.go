// Package nccltest holds what tests of code built on libgpu/nccl share:
// World, an in-process stand-in for NCCL on the host (ranks as goroutines
// of one process, every collective a barrier at which they hand over their
// bytes), so that data-parallel and ZeRO code runs in CI without GPUs; and
// the harness of the multi-GPU tests (NeedGPUs; Ranks, which runs a test
// binary's helper test as the ranks of a job through libgpu/dist/launch).
package nccltest
