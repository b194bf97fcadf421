// Package service owns the optimizer service's protocol and its client:
// the messages, the limits of a request and the checks of a tensor
// reference both sides apply (TensorRef.Check), the interprocess event
// both sides record and wait on (Event), and the Client a trainer uses. A
// trainer registers its parameter and gradient buffers (named buffers of
// a gpupool daemon) once, and each step is one message; the service
// (`optimizer serve`, whose server is optimizer/internal/server) maps the
// buffers from the pool, keeps the optimizer's state in the pool under the
// run's names, and applies libgpu/optim's updates in place on a stream of
// its own. GPU work of the two processes is ordered by interprocess CUDA
// events exchanged at registration, so no host waits for the GPU; on the
// host backend the service computes before it replies. A Remote is an
// optim.Optimizer, so a trainer uses the service exactly as an in-process
// optimizer.
//
// The protocol (messages on libgpu/ipc's framing) is specified in
// PROTOCOL.md beside this file.
package service
