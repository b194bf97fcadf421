package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// The Go mirror of cast.cu's cast_mt_args must match the C layout byte
// for byte (the .cu asserts the size with static_assert).
func TestCUDACastMultiArgsLayout(t *testing.T) {
	var a castMTArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(cast_mt_tensor)", unsafe.Sizeof(castMTTensor{}), 24},
		{"offsetof(cast_mt_tensor, n)", unsafe.Offsetof(castMTTensor{}.n), 16},
		{"sizeof(cast_mt_args)", unsafe.Sizeof(a), 3592},
		{"offsetof(cast_mt_args, start)", unsafe.Offsetof(a.start), 3072},
		{"offsetof(cast_mt_args, count)", unsafe.Offsetof(a.count), 3588},
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
	if len(plan) != 3 || plan[0].count != castMTMax || plan[2].count != 300-2*castMTMax {
		t.Fatalf("%d launches", len(plan))
	}
	for li, a := range plan {
		for j := 0; j < int(a.count); j++ {
			i := li*castMTMax + j
			if a.t[j].n != int64(sizes[i]) || a.t[j].dst != devPtr(dst[i]) || a.t[j].src != devPtr(src[i]) {
				t.Fatalf("tensor %d: %+v", i, a.t[j])
			}
			if got, want := int(a.start[j+1]-a.start[j]), (sizes[i]+castMTChunk-1)/castMTChunk; got != want {
				t.Fatalf("tensor %d of %d elements has %d blocks, want %d", i, sizes[i], got, want)
			}
		}
		if a.start[0] != 0 {
			t.Fatalf("launch %d starts at block %d", li, a.start[0])
		}
	}
}
