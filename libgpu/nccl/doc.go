// Package nccl owns gpukit's collectives across GPUs and machines: NVIDIA's
// NCCL (libnccl.so.2), loaded at run time with purego like libgpu/cuda's
// libraries (GPUKIT_CUDA_PATH, the loader path, the usual directories and
// the NVIDIA wheels of PyTorch's environment, where the GPU machines have
// it: site-packages/nvidia/nccl/lib), so binaries build without cgo and
// start without it. A missing library is one line naming libnccl.so.2 and
// GPUKIT_CUDA_PATH; NCCL older than 2.23 (MinVersion) is refused. Before
// its first call the package sets NCCL_NVLS_ENABLE=0 unless the
// environment sets it (NVLink multicast can take a shared GPU host out of
// service); nothing here calls cuMulticastCreate.
//
// A Comm is one rank's communicator. Connect makes it from the rank
// environment (libgpu/dist: torchrun's or Slurm's variables): rank 0 makes
// the NCCL unique id and hands it to every rank over TCP at
// MASTER_ADDR:MASTER_PORT (dist.Rendezvous), then every rank joins. One
// rank needs neither NCCL nor a GPU (Solo). Collectives — AllReduce (sum,
// avg, max, min, prod), Broadcast, AllGather, ReduceScatter, grouped with
// Group — take an *ops.Engine and *tensor.Tensor (f32, bf16, f16, i32, i64,
// u8) and are queued on the engine's stream (its side or communication
// stream inside Engine.Side or CommSide) in order with the ops around them, so tools never touch
// CUDA streams; they can be captured in a CUDA graph (Engine.Capture) once
// they have run eagerly (NCCL connects its peers on the first
// collective). A Reducer all-reduces gradient buckets (dist.Layout) on the
// communication stream as the backward completes them, overlapping the rest of the
// backward, as PyTorch's DistributedDataParallel does; Reducer.Compress
// makes its f32 buckets travel in bf16 (cast, bf16 all-reduce, cast back,
// on the same stream), as DDP's bf16_compress_hook does; Reducer.Scatter
// makes it reduce-scatter each bucket instead (ZeRO-1, libgpu/zero).
// Config bounds NCCL's CTAs per collective (ConnectConfig). nccltest holds
// the in-process stand-in for tests on the host and the multi-GPU harness.
//
// Results (ncclResult_t) are Go errors that name themselves without the
// library ("ncclSystemError (2)"); failed calls are CallErrors carrying
// NCCL's own message (ncclGetLastError). Sources: NCCL's nccl.h and its
// user guide ("Collective Operations", "Using NCCL with CUDA Graphs",
// "Group Calls"); nccl-tests' PERFORMANCE.md for bus bandwidth.
package nccl
