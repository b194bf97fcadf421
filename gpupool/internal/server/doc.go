// Package server owns the gpupool daemon's state and the ops of
// libgpu/ipc/PROTOCOL.md that act on it. It knows nothing of flags; the
// CLI layer (internal/app) builds a Config and serves a Pool with an
// ipc.Server. By file:
//
//   - slab.go, cuda.go: where slabs come from (SlabSource): memfd slabs
//     sealed against resizing on the host (Memfd); CUDA VMM allocations
//     exported as POSIX fds, and cuMemAlloc buffers with a legacy
//     CUipcMemHandle for CuPy and PyTorch, on a GPU (CUDA);
//   - pool.go: the Config, the Pool (admission of peers by uid and group,
//     stats, shutdown) and its limits;
//   - slabs.go: placement of an allocation in a slab (best fit over the
//     shared slabs through package arena, or a slab of its own), within
//     Limit and the file-descriptor budget, and the release of empty slabs;
//   - session.go: one session per connection, its requests dispatched by
//     op, and what it held given back when it ends;
//   - buffers.go: allocations, leases, names, seals, interprocess events,
//     per-uid quotas and --isolate;
//   - orphans.go: kept buffers left unsealed by a creator that is gone,
//     removed after Config.OrphanGrace;
//   - ls.go: the paged listing;
//   - metrics.go: the stats in Prometheus's text format.
package server
