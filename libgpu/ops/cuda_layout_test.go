package ops

import (
	"testing"
	"unsafe"

	"gpukit/libgpu/kernels/launch"
)

// The Go mirrors of the kernel parameter structs in
// libgpu/kernels/ops_optim.cu must match the C layout byte for byte (the
// .cu asserts the same sizes with static_assert).
func TestCUDAMultiTensorArgsLayout(t *testing.T) {
	var a launch.OpsAdamArgs
	var s launch.OpsSgdArgs
	checks := []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(ops_adam_tensor)", unsafe.Sizeof(launch.OpsAdamTensor{}), 48},
		{"sizeof(ops_adam_args)", unsafe.Sizeof(a), 1712},
		{"offsetof(ops_adam_tensor, wd)", unsafe.Offsetof(launch.OpsAdamTensor{}.Wd), 40},
		{"offsetof(ops_adam_args, start)", unsafe.Offsetof(a.Start), 1536},
		{"offsetof(ops_adam_args, count)", unsafe.Offsetof(a.Count), 1668},
		{"offsetof(ops_adam_args, lr)", unsafe.Offsetof(a.Lr), 1672},
		{"offsetof(ops_adam_args, bc)", unsafe.Offsetof(a.Bc), 1688},
		{"offsetof(ops_adam_args, lr_scale)", unsafe.Offsetof(a.LrScale), 1696},
		{"offsetof(ops_adam_args, g_scale)", unsafe.Offsetof(a.GScale), 1704},
		{"sizeof(ops_sgd_tensor)", unsafe.Sizeof(launch.OpsSgdTensor{}), 32},
		{"sizeof(ops_sgd_args)", unsafe.Sizeof(s), 1176},
		{"offsetof(ops_sgd_args, count)", unsafe.Offsetof(s.Count), 1156},
		{"offsetof(ops_sgd_args, lr)", unsafe.Offsetof(s.Lr), 1160},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}

// mtPlan gives each tensor ceil(n/mtChunk) consecutive blocks, at most
// mtMax tensors per launch, empty tensors none.
func TestCUDAMultiTensorPlan(t *testing.T) {
	sizes := make([]int, 70)
	for i := range sizes {
		sizes[i] = (i * 977) % 5000 // includes 0 and sizes above mtChunk
	}
	groups, err := mtPlan(sizes)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 3 || groups[0].hi-groups[0].lo != mtMax || groups[2].hi != len(sizes) {
		t.Fatalf("groups %+v", groups)
	}
	next := 0
	for _, g := range groups {
		if g.lo != next {
			t.Fatalf("group starts at %d, want %d", g.lo, next)
		}
		next = g.hi
		if g.start[0] != 0 {
			t.Fatalf("first block %d", g.start[0])
		}
		for i := g.lo; i < g.hi; i++ {
			got := int(g.start[i-g.lo+1] - g.start[i-g.lo])
			if want := (sizes[i] + mtChunk - 1) / mtChunk; got != want {
				t.Fatalf("tensor %d of %d elements has %d blocks, want %d", i, sizes[i], got, want)
			}
		}
	}
}
