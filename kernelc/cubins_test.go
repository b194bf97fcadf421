package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpukit/libgpu/kernels"
)

// TestRealCubins reads the cubins NVRTC made on a GPU machine (see
// testdata/README.md) and checks what the source of selftest.cu fixes: the
// arch, the kernels present, gpukit_block_sum's 1 KiB of static shared
// memory (float tile[256]) and its __launch_bounds__(256).
func TestRealCubins(t *testing.T) {
	files, _ := filepath.Glob("testdata/cubins/selftest.*.cubin")
	if len(files) == 0 {
		t.Skip("no real cubins committed yet (testdata/README.md says how to make them)")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		info, err := kernels.ParseCubin(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		wantArch := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "selftest."), ".cubin")
		if info.Arch != wantArch {
			t.Errorf("%s: arch %q, want %q", f, info.Arch, wantArch)
		}
		got := map[string]kernels.KernelInfo{}
		for _, k := range info.Kernels {
			got[k.Name] = k
			if k.Registers <= 0 || k.Registers > 255 {
				t.Errorf("%s %s: %d registers", f, k.Name, k.Registers)
			}
		}
		axpy, ok1 := got["gpukit_axpy"]
		sum, ok2 := got["gpukit_block_sum"]
		if !ok1 || !ok2 {
			t.Fatalf("%s: kernels %v, want gpukit_axpy and gpukit_block_sum", f, info.Kernels)
		}
		if sum.SharedBytes != 256*4 || sum.MaxThreads != 256 {
			t.Errorf("%s gpukit_block_sum: shared %d, max threads %d; want 1024, 256", f, sum.SharedBytes, sum.MaxThreads)
		}
		if axpy.SharedBytes != 0 || axpy.LocalBytes != 0 {
			t.Errorf("%s gpukit_axpy: shared %d, local %d; want 0, 0", f, axpy.SharedBytes, axpy.LocalBytes)
		}
	}
}
