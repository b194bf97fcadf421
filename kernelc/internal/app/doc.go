// Package app is the command-line layer of kernelc: flags, subcommands and
// output formats. The compiler, the cache and the cubin reader live in
// gpukit/libgpu/kernels.
package app
