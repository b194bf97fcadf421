// Package pool owns the client of the gpupool daemon and the messages of its
// protocol (the ops table is in libgpu/ipc/PROTOCOL.md).
//
// A Client dials the daemon's socket, maps each slab the daemon sends it once
// (the fd arrives over SCM_RIGHTS with the first allocation in that slab) and
// hands out device.Buffers that are views into those mappings; every
// allocation after the first in a slab is one message round trip. *Client
// implements device.Allocator, so code written against an Allocator can use
// the pool or in-process memory (device.Local) alike.
//
// Leases belong to the connection: when the client process dies, the daemon
// releases everything it held.
package pool
