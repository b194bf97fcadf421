// Package server owns the optimizer service's server (`optimizer serve`),
// beside its tool as gpupool's is: Server is the ipc.Handler of
// libgpu/optim/service/PROTOCOL.md. Each connection registers one run,
// whose request body is read field by field with overflow-checked spans
// (decode.go: DecodeRegister, DecodeStep); the run's parameter and
// gradient buffers are mapped, and its state allocated, through the pool
// connection the client handed over (Pools, Memory), counted against
// MaxRunBytes (account), and its optimizer steps on an engine of its own,
// ordered with the client's stream by service.Event. Run names are per
// uid; a name whose client hung up is taken over at once. The messages,
// limits and client stay in libgpu/optim/service, which other tools
// import; this package knows nothing of flags (internal/app builds a
// Server).
package server
