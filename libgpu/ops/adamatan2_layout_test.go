package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// aa2Args must match struct aa2_args of adamatan2.cu byte for byte (the
// .cu asserts the size).
func TestCUDAAdamATan2ArgsLayout(t *testing.T) {
	var a launch.Aa2Args
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(aa2_tensor)", unsafe.Sizeof(a.T[0]), 48},
		{"sizeof(aa2_args)", unsafe.Sizeof(a), 1720},
		{"offsetof(aa2_args, start)", unsafe.Offsetof(a.Start), 1536},
		{"offsetof(aa2_args, count)", unsafe.Offsetof(a.Count), 1668},
		{"offsetof(aa2_args, inside)", unsafe.Offsetof(a.Inside), 1692},
		{"offsetof(aa2_args, step)", unsafe.Offsetof(a.Step), 1696},
		{"offsetof(aa2_args, g_scale)", unsafe.Offsetof(a.GScale), 1712},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
