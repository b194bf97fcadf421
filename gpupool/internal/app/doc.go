// Package app owns the gpupool command line: flags, subcommands and exit
// codes. main.go only calls Main; the daemon's state lives in
// internal/server and the protocol in libgpu/ipc and libgpu/pool.
package app
