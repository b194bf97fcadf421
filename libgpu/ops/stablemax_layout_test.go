package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// smxKArgs and bceKArgs must match struct smx_args of stablemax.cu and
// struct bce_args of bce.cu byte for byte (the .cu files assert the sizes).
func TestCUDAStablemaxArgsLayout(t *testing.T) {
	var a launch.SmxArgs
	var b launch.BceArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(smx_args)", unsafe.Sizeof(a), 128},
		{"offsetof(smx_args, B)", unsafe.Offsetof(a.B), 56},
		{"offsetof(smx_args, group)", unsafe.Offsetof(a.Group), 104},
		{"offsetof(smx_args, V)", unsafe.Offsetof(a.V), 112},
		{"offsetof(smx_args, scale)", unsafe.Offsetof(a.Scale), 120},
		{"offsetof(smx_args, acc)", unsafe.Offsetof(a.Acc), 124},
		{"sizeof(bce_args)", unsafe.Sizeof(b), 48},
		{"offsetof(bce_args, n)", unsafe.Offsetof(b.N), 32},
		{"offsetof(bce_args, acc)", unsafe.Offsetof(b.Acc), 44},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
