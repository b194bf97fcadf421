package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// attnArgs must match struct attn_args of libgpu/kernels/attention.cu byte
// for byte (the .cu asserts the size; scripts/cudaemu/attention_test.cpp
// asserts these offsets on the C side with the host compiler, whose LP64
// layout is NVPTX's).
func TestAttentionArgsLayout(t *testing.T) {
	var a attnArgs
	checks := []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(attn_args)", unsafe.Sizeof(a), 360},
		{"offsetof(attn_args, delta)", unsafe.Offsetof(a.Delta), 72},
		{"offsetof(attn_args, sq)", unsafe.Offsetof(a.Sq), 80},
		{"offsetof(attn_args, sdv)", unsafe.Offsetof(a.Sdv), 248},
		{"offsetof(attn_args, B)", unsafe.Offsetof(a.B), 272},
		{"offsetof(attn_args, D)", unsafe.Offsetof(a.D), 288},
		{"offsetof(attn_args, acc_q)", unsafe.Offsetof(a.AccQ), 296},
		{"offsetof(attn_args, acc_v)", unsafe.Offsetof(a.AccV), 304},
		{"offsetof(attn_args, scale)", unsafe.Offsetof(a.Scale), 312},
		{"offsetof(attn_args, scale_log2)", unsafe.Offsetof(a.ScaleLog2), 316},
		{"offsetof(attn_args, drop_counter)", unsafe.Offsetof(a.DropCounter), 320},
		{"offsetof(attn_args, drop_seed)", unsafe.Offsetof(a.DropSeed), 328},
		{"offsetof(attn_args, drop_b0)", unsafe.Offsetof(a.DropB0), 336},
		{"offsetof(attn_args, drop_p)", unsafe.Offsetof(a.DropP), 344},
		{"offsetof(attn_args, drop_scale)", unsafe.Offsetof(a.DropScale), 348},
		{"offsetof(attn_args, drop_site)", unsafe.Offsetof(a.DropSite), 352},
		{"sizeof(attn_dec_strides)", unsafe.Sizeof(launch.AttnDecStrides{}), 96},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}
