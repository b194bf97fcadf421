// Package launch starts the ranks of a data-parallel job on one machine, as
// torchrun does: one process per GPU with torchrun's environment (RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
// MASTER_PORT; see dist.World), and takes the job down cleanly: when a rank
// fails, the others are stopped (SIGTERM to their process groups, SIGKILL
// after a grace period), signals the launcher gets are passed on, and every
// rank dies with the launcher (PR_SET_PDEATHSIG). The launcher's process
// logic lives here so that it is tested without the trainer (trainer
// launch is its command line).
//
// Ranks choose their GPU from LOCAL_RANK (dist.World.DeviceOrdinal), with
// every GPU visible, as torchrun's scripts do; the launcher leaves
// CUDA_VISIBLE_DEVICES alone, so NCCL sees the whole machine.
package launch
