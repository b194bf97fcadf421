package ops_test

import (
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
)

// TestCUDAWhile runs the While checks on the GPU: the loop eagerly (host
// loop reading the flag), then captured as a CUDA graph with a conditional
// WHILE node and replayed on data that asks for 0 to 11 iterations, with
// and without an iteration limit, and nested loops (a WHILE node in a
// WHILE node's body): x, the work after the loop and the trip counts must
// equal the plain-Go simulation that TestWhileHost checks the host loop
// against.
func TestCUDAWhile(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecF32)
	runWhile(t, e, device.Local{Dev: d})
	t.Logf("condition kernel loaded from PTX (cubin fallback): %v", e.WhilePTX())
}

// TestCUDAWhileHRMBlock runs runWhileHRMBlock on the GPU (bf16 GEMMs):
// HRM's halting loop as a conditional WHILE node equals its host loop
// bitwise.
func TestCUDAWhileHRMBlock(t *testing.T) {
	d := gpu(t)
	runWhileHRMBlock(t, cudaEngine(t, d, ops.PrecBF16), device.Local{Dev: d})
}
