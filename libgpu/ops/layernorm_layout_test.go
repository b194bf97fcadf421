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

// residentBlocks follows the sm_90 limits.
func TestResidentBlocks(t *testing.T) {
	for _, c := range []struct{ regs, smem, threads, want int }{
		{32, 0, 256, 8},         // threads: 2048/256
		{64, 0, 256, 4},         // registers: 65536/(64·256)
		{100, 0, 256, 2},        // 104 regs per thread allocated
		{255, 0, 256, 1},        // at least one
		{16, 0, 32, 32},         // blocks
		{32, 100 << 10, 128, 2}, // shared memory: 228 KiB / 101 KiB
	} {
		if got := residentBlocks(c.regs, c.smem, c.threads); got != c.want {
			t.Errorf("residentBlocks(%d, %d, %d) = %d, want %d", c.regs, c.smem, c.threads, got, c.want)
		}
	}
}
