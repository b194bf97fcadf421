package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// lnKArgs must match struct ln_args of layernorm.cu byte for byte (the
// .cu asserts the size).
func TestCUDALayerNormArgsLayout(t *testing.T) {
	var a launch.LnArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(ln_args)", unsafe.Sizeof(a), 240},
		{"offsetof(ln_args, part)", unsafe.Offsetof(a.Part), 112},
		{"offsetof(ln_args, rows)", unsafe.Offsetof(a.Rows), 128},
		{"offsetof(ln_args, lddr)", unsafe.Offsetof(a.Lddr), 192},
		{"offsetof(ln_args, rpb)", unsafe.Offsetof(a.Rpb), 200},
		{"offsetof(ln_args, C)", unsafe.Offsetof(a.C), 208},
		{"offsetof(ln_args, eps)", unsafe.Offsetof(a.Eps), 216},
		{"offsetof(ln_args, acc_dx)", unsafe.Offsetof(a.AccDx), 220},
		{"offsetof(ln_args, group)", unsafe.Offsetof(a.Group), 236},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
