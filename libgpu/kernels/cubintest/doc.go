// Package cubintest builds small synthetic cubins (CUDA ELF files) for tests
// that must run without a GPU or NVRTC: they carry exactly the sections and
// records that kernels.ParseCubin reads (see libgpu/kernels/cubin.go for the
// layout and its sources), and no machine code.
package cubintest
