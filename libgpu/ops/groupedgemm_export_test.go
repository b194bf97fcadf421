package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// Grouped GEMM kernel paths for SetGroupedPath.
const (
	GroupedDefault = 0 // wgmma 128 × 256 tiles on sm_90a, else CUDA cores
	GroupedWG128   = 1 // wgmma 128 × 128 tiles
	GroupedSIMT    = 2 // CUDA cores
	// The forward's bound probes (wgmma 128 × 256, bf16 out; wrong
	// results): loads and barriers without the wgmma, the wgmma without
	// the loads, everything but the epilogue's stores.
	GroupedProbeLoads   = 3
	GroupedProbeMMA     = 4
	GroupedProbeNoStore = 5
)

// SetGroupedPath chooses the kernels of bf16 grouped products on CUDA from
// now on and returns a func that restores the previous choice.
func SetGroupedPath(p int) (restore func()) {
	return setVar(&groupedPath, p)
}

// GroupedHopper reports whether e's CUDA backend runs the wgmma kernels.
func GroupedHopper(e *Engine) bool {
	return e.c != nil && e.c.ggHopper()
}

// ggArgs must match struct gg_args of libgpu/kernels/groupedgemm.cu byte
// for byte (the .cu asserts its size; scripts/cudaemu/groupedgemm_test.cpp
// asserts offsets on the C side).
func TestGroupedArgsLayout(t *testing.T) {
	var a launch.GgArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(gg_args)", unsafe.Sizeof(a), 104},
		{"offsetof(gg_args, lda)", unsafe.Offsetof(a.Lda), 40},
		{"offsetof(gg_args, E)", unsafe.Offsetof(a.E), 80},
		{"offsetof(gg_args, acc)", unsafe.Offsetof(a.Acc), 100},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
