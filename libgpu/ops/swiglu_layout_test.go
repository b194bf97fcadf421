package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// swigluKArgs must match struct swiglu_args of swiglu.cu byte for byte
// (the .cu asserts the size).
func TestCUDASwiGLUArgsLayout(t *testing.T) {
	var a launch.SwigluArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(swiglu_args)", unsafe.Sizeof(a), 64},
		{"offsetof(swiglu_args, rows)", unsafe.Offsetof(a.Rows), 24},
		{"offsetof(swiglu_args, I)", unsafe.Offsetof(a.I), 56},
		{"offsetof(swiglu_args, acc)", unsafe.Offsetof(a.Acc), 60},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
