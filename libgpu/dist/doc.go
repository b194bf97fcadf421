// Package dist owns what data-parallel training needs besides the
// collectives themselves (libgpu/nccl): where this process stands in a job
// (World, from torchrun's or Slurm's environment), the rendezvous that
// hands rank 0's NCCL unique id to every rank over TCP (Rendezvous), and
// the layout of gradients in buckets that are all-reduced as the backward
// produces them (Plan, Layout, Grads), cut into one part per rank for
// ZeRO-1 (BucketConfig.Shards, Layout.Part, Segments). Process launching lives in
// libgpu/dist/launch. Nothing here needs a GPU.
package dist
