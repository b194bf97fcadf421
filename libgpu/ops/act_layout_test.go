package ops

import (
	"testing"
	"unsafe"
)

// actKArgs must match struct act_args of act.cu byte for byte (the .cu
// asserts the size).
func TestCUDAACTArgsLayout(t *testing.T) {
	var a actKArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(act_args)", unsafe.Sizeof(a), 328},
		{"offsetof(act_args, tokens)", unsafe.Offsetof(a.tokens), 88},
		{"offsetof(act_args, q)", unsafe.Offsetof(a.q), 136},
		{"offsetof(act_args, cond)", unsafe.Offsetof(a.cond), 216},
		{"offsetof(act_args, n)", unsafe.Offsetof(a.n), 224},
		{"offsetof(act_args, warmup)", unsafe.Offsetof(a.warmup), 248},
		{"offsetof(act_args, B)", unsafe.Offsetof(a.b), 272},
		{"offsetof(act_args, slots)", unsafe.Offsetof(a.slots), 292},
		{"offsetof(act_args, explore)", unsafe.Offsetof(a.explore), 308},
		{"offsetof(act_args, acc)", unsafe.Offsetof(a.acc), 316},
		{"offsetof(act_args, scale)", unsafe.Offsetof(a.scale), 320},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
