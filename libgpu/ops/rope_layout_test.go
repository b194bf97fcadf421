package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// ropeKArgs must match struct rope_args of rope.cu byte for byte (the .cu
// asserts the size).
func TestCUDARoPEArgsLayout(t *testing.T) {
	var a launch.RopeArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(rope_args)", unsafe.Sizeof(a), 120},
		{"offsetof(rope_args, n)", unsafe.Offsetof(a.N), 32},
		{"offsetof(rope_args, ys2)", unsafe.Offsetof(a.Ys2), 80},
		{"offsetof(rope_args, T)", unsafe.Offsetof(a.T), 88},
		{"offsetof(rope_args, acc)", unsafe.Offsetof(a.Acc), 108},
		{"offsetof(rope_args, vec)", unsafe.Offsetof(a.Vec), 112},
		{"offsetof(rope_args, narrow)", unsafe.Offsetof(a.Narrow), 116},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
