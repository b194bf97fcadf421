package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// actKArgs must match struct act_args of act.cu byte for byte (the .cu
// asserts the size).
func TestCUDAACTArgsLayout(t *testing.T) {
	var a launch.ActArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(act_args)", unsafe.Sizeof(a), 328},
		{"offsetof(act_args, tokens)", unsafe.Offsetof(a.Tokens), 88},
		{"offsetof(act_args, q)", unsafe.Offsetof(a.Q), 136},
		{"offsetof(act_args, cond)", unsafe.Offsetof(a.Cond), 216},
		{"offsetof(act_args, n)", unsafe.Offsetof(a.N), 224},
		{"offsetof(act_args, warmup)", unsafe.Offsetof(a.Warmup), 248},
		{"offsetof(act_args, B)", unsafe.Offsetof(a.B), 272},
		{"offsetof(act_args, slots)", unsafe.Offsetof(a.Slots), 292},
		{"offsetof(act_args, explore)", unsafe.Offsetof(a.Explore), 308},
		{"offsetof(act_args, acc)", unsafe.Offsetof(a.Acc), 316},
		{"offsetof(act_args, scale)", unsafe.Offsetof(a.Scale), 320},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
