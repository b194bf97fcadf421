// Package exec is gpukit's compute runtime: what runs work on a device,
// below the op families of libgpu/ops. It owns
//
//   - the Engine (engine.go): one device, its backend — Host (plain Go) or
//     CUDA (one non-blocking stream, a cuBLASLt handle and workspace,
//     cuSOLVER on demand) — and the device thread (Do: a CUDA context is
//     current per OS thread);
//   - kernel loading and launches (kernels.go): the CUDA backend is the
//     launch.Launcher through which the typed launchers of
//     libgpu/kernels/launch queue kernels, each looked up once per engine
//     from libgpu/kernels' compiler (NVRTC and the kernel cache; compiled
//     in parallel when prefetched), with dynamic shared memory raised as
//     asked; occupancy (occupancy.go) sizes persistent grids;
//   - capture (capture.go): a sequence of work recorded as a CUDA graph and
//     replayed, and While (while.go), a data-dependent loop that becomes a
//     conditional WHILE node of the graph;
//   - events (event.go): in-queue events and the one inter-process CUDA
//     event type (IPCEvent) of the pool client and the optimizer service;
//   - staging memory and copies queued in order (staging.go), scratch
//     buffers (scratch.go), side and communication streams (side.go),
//     and lanes (lanes.go): one op's independent library calls fanned
//     out over streams and joined back (QR's and Eigh's per-matrix
//     cuSOLVER calls);
//   - per-backend state of the op families (state.go: StateOf), so a
//     family keeps what it caches without the runtime knowing it.
//
// Every call works on every backend: on the host, work runs when it is
// queued, a captured graph replays its function, an event is always
// complete and staging memory is ordinary memory. docs/ARCHITECTURE-runtime.md
// follows a launch from an op to a kernel.
package exec
