package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// clipArgs must match ops_clip_args in libgpu/kernels/ops_clip.cu (which
// asserts the same size with static_assert).
func TestCUDAClipArgsLayout(t *testing.T) {
	var a launch.OpsClipArgs
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(ops_clip_tensor)", unsafe.Sizeof(launch.OpsClipTensor{}), 16},
		{"offsetof(ops_clip_args, start)", unsafe.Offsetof(a.Start), 512},
		{"offsetof(ops_clip_args, count)", unsafe.Offsetof(a.Count), 644},
		{"sizeof(ops_clip_args)", unsafe.Sizeof(a), 648},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}

// clipPlan numbers blocks across launches so each launch writes its own
// range of partial sums.
func TestCUDAClipPlan(t *testing.T) {
	sizes := make([]int, 70)
	for i := range sizes {
		sizes[i] = (i * 977) % 5000
	}
	groups, total, err := clipPlan(sizes)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	for _, n := range sizes {
		want += int64((n + clipChunk - 1) / clipChunk)
	}
	if total != want || len(groups) != 3 {
		t.Fatalf("%d blocks in %d launches, want %d in 3", total, len(groups), want)
	}
	next := int64(0)
	for _, g := range groups {
		if g.first != next {
			t.Fatalf("launch of tensors [%d,%d) starts at block %d, want %d", g.lo, g.hi, g.first, next)
		}
		next += int64(g.start[g.hi-g.lo])
	}
}
