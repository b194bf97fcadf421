package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// rmsKArgs must match struct rms_args of rmsnorm.cu byte for byte (the .cu
// asserts the size).
func TestCUDARMSNormArgsLayout(t *testing.T) {
	var a launch.RmsArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(rms_args)", unsafe.Sizeof(a), 168},
		{"offsetof(rms_args, gw)", unsafe.Offsetof(a.Gw), 72},
		{"offsetof(rms_args, rows)", unsafe.Offsetof(a.Rows), 80},
		{"offsetof(rms_args, lddr)", unsafe.Offsetof(a.Lddr), 136},
		{"offsetof(rms_args, C)", unsafe.Offsetof(a.C), 144},
		{"offsetof(rms_args, eps)", unsafe.Offsetof(a.Eps), 152},
		{"offsetof(rms_args, acc_dr)", unsafe.Offsetof(a.AccDr), 160},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
