package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/device"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// The Go mirror of cast.cu's cast_mt_args must match the C layout byte
// for byte (the .cu asserts the size with static_assert).
func TestCUDACastMultiArgsLayout(t *testing.T) {
	var a launch.CastMtArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(cast_mt_tensor)", unsafe.Sizeof(launch.CastMtTensor{}), 24},
		{"offsetof(cast_mt_tensor, n)", unsafe.Offsetof(launch.CastMtTensor{}.N), 16},
		{"sizeof(cast_mt_args)", unsafe.Sizeof(a), 3592},
		{"offsetof(cast_mt_args, start)", unsafe.Offsetof(a.Start), 3072},
		{"offsetof(cast_mt_args, count)", unsafe.Offsetof(a.Count), 3588},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}

// castMTPlan gives each tensor ceil(n/castMTChunk) consecutive blocks and
// at most castMTMax tensors per launch.
func TestCUDACastMultiPlan(t *testing.T) {
	h := device.NewHost()
	var dst, src []*tensor.Tensor
	var sizes []int
	for i := 0; i < 300; i++ {
		n := 1 + (i*977)%9000
		d, err := tensor.Alloc(device.Local{Dev: h}, "", tensor.BF16, n)
		if err != nil {
			t.Fatal(err)
		}
		s, err := tensor.Alloc(device.Local{Dev: h}, "", tensor.F32, n)
		if err != nil {
			t.Fatal(err)
		}
		dst, src, sizes = append(dst, d), append(src, s), append(sizes, n)
	}
	plan, err := castMTPlan(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != 3 || plan[0].Count != castMTMax || plan[2].Count != 300-2*castMTMax {
		t.Fatalf("%d launches", len(plan))
	}
	for li, a := range plan {
		for j := 0; j < int(a.Count); j++ {
			i := li*castMTMax + j
			if a.T[j].N != int64(sizes[i]) || a.T[j].Dst != devPtr(dst[i]) || a.T[j].Src != devPtr(src[i]) {
				t.Fatalf("tensor %d: %+v", i, a.T[j])
			}
			if got, want := int(a.Start[j+1]-a.Start[j]), (sizes[i]+castMTChunk-1)/castMTChunk; got != want {
				t.Fatalf("tensor %d of %d elements has %d blocks, want %d", i, sizes[i], got, want)
			}
		}
		if a.Start[0] != 0 {
			t.Fatalf("launch %d starts at block %d", li, a.Start[0])
		}
	}
}
