package kernels_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
)

// TestNVRTCAdapter checks the libgpu/cuda-backed NVRTC on any machine: where
// the library loads, its version reads "major.minor"; where it does not,
// Compile fails with one line that wraps cuda.ErrNoLibrary and names
// libnvrtc and GPUKIT_CUDA_PATH, and nothing is cached.
func TestNVRTCAdapter(t *testing.T) {
	n := kernels.NewNVRTC()
	v, err := n.Version()
	if err == nil {
		if !regexp.MustCompile(`^\d+\.\d+$`).MatchString(v) {
			t.Fatalf("version %q", v)
		}
		return
	}
	cache, cerr := kernels.OpenCache(t.TempDir())
	if cerr != nil {
		t.Fatal(cerr)
	}
	_, err = kernels.NewCompiler(n, cache).Compile(kernels.Source{Name: "a.cu", Code: []byte("__global__ void k(){}")},
		kernels.Options{Arch: "sm_90a"})
	msg := err.Error()
	if !errors.Is(err, cuda.ErrNoLibrary) || !strings.Contains(msg, "libnvrtc") ||
		!strings.Contains(msg, "GPUKIT_CUDA_PATH") || strings.Contains(msg, "\n") {
		t.Fatalf("error %q", msg)
	}
	if es, _ := cache.List(); len(es) != 0 {
		t.Fatal("something was cached")
	}
}
