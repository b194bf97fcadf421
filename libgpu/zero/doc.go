// Package zero owns ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", SC 2020,
// arXiv 1910.02054, §5.1 "P_os"): data-parallel training with the
// optimizer state split across the ranks instead of replicated.
//
// AdamW is the flat path. The gradients live in buckets (dist.Layout with
// Shards = the world size, so every bucket is cut into equal aligned
// parts, one per rank); the reducer reduce-scatters each bucket during the
// backward (nccl.Reducer.Scatter) instead of all-reducing it, so rank r
// ends the backward with the averaged gradients of part r of every bucket
// only; AdamW keeps exp_avg and exp_avg_sq for those elements only
// (1/n of the state) and updates those elements of the parameters, which
// live in bucket storage laid out like the gradients (nn.GPT.SetParams);
// one in-place all-gather per bucket then gives every rank every updated
// parameter. Gradient clipping takes the global norm: each rank's sum of
// squares of its part, all-reduced (ops.Engine.SumSquares,
// ClipCoefFromSumSquares). Everything is queued on the engine's streams
// with no host synchronisation, so the step can be captured in a CUDA
// graph; per step a rank sends what an all-reduce sends (a reduce-scatter
// and an all-gather each move (n−1)/n of the buckets).
//
// Owned is the path for optimizers whose update of a parameter needs the
// whole of its gradient (Shampoo's and SOAP's preconditioners, Muon's
// orthogonalisation): each parameter is owned by one rank (Assign: largest
// cost first to the least loaded rank, as Distributed Shampoo balances its
// blocks), each rank's optimizer holds the state of its own parameters
// only, the gradients are all-reduced whole as without sharding, and each
// parameter is broadcast from its owner after the step.
//
// Checkpoints hold whole tensors under the names the unsharded optimizer
// gives them ("<param>.exp_avg", ..., "step"): GatherState assembles them
// on one rank (a collective: every rank calls it), LoadState takes what a
// rank needs out of whole tensors, so a run may resume at any world size,
// sharded or not.
package zero
