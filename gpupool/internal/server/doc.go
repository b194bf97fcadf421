// Package server owns the gpupool daemon's state: slabs from a SlabSource
// (memfd now, CUDA VMM later), the sub-allocation of slabs (package arena),
// leases held per connection, named buffers, per-uid quotas and the access
// list, and the ops of libgpu/ipc/PROTOCOL.md that act on them. It knows
// nothing of flags; the CLI layer (internal/app) builds a Config.
package server
