// Package app is the command-line layer of tracer: flags and subcommands
// only; the collector is tracer/internal/collect, the file format
// tracer/internal/chrome, the summary tracer/internal/report, and the client
// every tool links libgpu/trace.
//
// Contract (in the manner of TOOLS.md):
//   - `serve` MUST print the socket path on stdout once it accepts
//     connections, MUST refuse a socket a live daemon answers on, and on
//     SIGTERM or SIGINT MUST stop, leave a valid trace file and exit 0.
//   - The trace file MUST be valid JSON after any stop: it is rewritten with
//     its closing brackets on every flush.
//   - `record` MUST exit with the command's exit status, and pass GPUKIT_TRACE
//     to it; it MUST write the file even when the command fails.
//   - Malformed batches MUST be refused and counted, never stop the collector.
package app
