package ops_test

import (
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops/opstest"
)

func TestHostClipGradNorm(t *testing.T) {
	opstest.CheckClip(t, device.NewHost())
}

// TestCUDAClipGradNorm: the fused, sync-free clip on the GPU against the
// float64 reference, bitwise repeatable.
func TestCUDAClipGradNorm(t *testing.T) {
	opstest.CheckClip(t, gpu(t))
}
