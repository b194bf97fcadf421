package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// The Go mirrors of the U-Net kernels' argument structs have their C
// layouts (LP64, as NVPTX): conv2d.cu's conv_args and conv_igemm_args
// (conv2d.cuh), conv2d_wg.cu's conv_wg_dw_args,
// diffusion.cu's diff_args.
func TestUNetKernelArgLayouts(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"conv_args", unsafe.Sizeof(launch.ConvArgs{}), 12 * 4},
		{"conv_igemm_args", unsafe.Sizeof(launch.ConvIgemmArgs{}), 4*8 + 12*4 + 4*8 + 2*4},
		{"conv_igemm_args.pro_scale", unsafe.Offsetof(launch.ConvIgemmArgs{}.ProScale), 80},
		{"conv_igemm_args.pro_silu", unsafe.Offsetof(launch.ConvIgemmArgs{}.ProSilu), 112},
		{"conv_wg_dw_args", unsafe.Sizeof(launch.ConvWgDwArgs{}), 3*8 + 12*4},
		{"conv_wg_dw_args.chunk", unsafe.Offsetof(launch.ConvWgDwArgs{}.Chunk), 68},
		{"diff_args", unsafe.Sizeof(launch.DiffArgs{}), 8*8 + 8 + 8 + 4*4},
		{"diff_args.seed", unsafe.Offsetof(launch.DiffArgs{}.Seed), 64},
		{"diff_args.stream", unsafe.Offsetof(launch.DiffArgs{}.Stream), 92},
		{"conv_igemm_args.n", unsafe.Offsetof(launch.ConvIgemmArgs{}.N), 32},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
}
