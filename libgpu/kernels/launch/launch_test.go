package launch

import (
	"errors"
	"slices"
	"testing"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/kernels"
)

// recorder is a Launcher that keeps what it was asked to launch.
type recorder struct {
	k     Kernel
	grid  [3]uint32
	block [3]uint32
	smem  uint32
	args  []unsafe.Pointer
}

func (r *recorder) Launch(k Kernel, grid, block [3]uint32, smem uint32, args ...unsafe.Pointer) error {
	r.k, r.grid, r.block, r.smem, r.args = k, grid, block, smem, args
	return nil
}

func TestAllKernelsAreEmbedded(t *testing.T) {
	srcs := kernels.Sources()
	seen := map[Kernel]bool{}
	for _, k := range All() {
		if !slices.Contains(srcs, k.File) {
			t.Errorf("%v: no embedded source %s", k, k.File)
		}
		if seen[k] {
			t.Errorf("%v listed twice", k)
		}
		seen[k] = true
	}
	if len(seen) < 100 {
		t.Errorf("%d kernels, want the whole library's", len(seen))
	}
}

func TestTemplateLauncherPassesTypedArguments(t *testing.T) {
	var r recorder
	y, a, b := cuda.DevicePtr(0x1000), cuda.DevicePtr(0x2000), cuda.DevicePtr(0x3000)
	if err := Add(&r, "v_bf16", [3]uint32{7, 1, 1}, [3]uint32{256, 1, 1}, 64, y, a, b, 12345); err != nil {
		t.Fatal(err)
	}
	if r.k != (Kernel{File: "add.cu", Name: "add_v_bf16"}) || r.grid[0] != 7 || r.block[0] != 256 || r.smem != 64 {
		t.Fatalf("launched %v grid %v block %v smem %d", r.k, r.grid, r.block, r.smem)
	}
	if len(r.args) != 4 || *(*cuda.DevicePtr)(r.args[0]) != y || *(*cuda.DevicePtr)(r.args[1]) != a ||
		*(*cuda.DevicePtr)(r.args[2]) != b || *(*int64)(r.args[3]) != 12345 {
		t.Fatalf("arguments %v", r.args)
	}
}

func TestTemplateLauncherRefusesUnknownInstance(t *testing.T) {
	var r recorder
	err := Add(&r, "q_f32", [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, 0, 0, 0, 1)
	if !errors.Is(err, ErrNoInstance) {
		t.Fatalf("err = %v, want ErrNoInstance", err)
	}
	if r.args != nil {
		t.Fatal("launched an unknown instance")
	}
	if _, err := LnFwdKernel("e8s_f16"); !errors.Is(err, ErrNoInstance) {
		t.Fatalf("LnFwdKernel(e8s_f16): %v", err)
	}
}

func TestStructArgumentIsPassedByValue(t *testing.T) {
	var r recorder
	a := &BceArgs{N: 9, Scale: 0.5, Acc: 1}
	if err := Bce(&r, "f32_f32", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, a); err != nil {
		t.Fatal(err)
	}
	if len(r.args) != 1 || (*BceArgs)(r.args[0]) != a {
		t.Fatalf("arguments %v, want the struct's address", r.args)
	}
	if err := Bce(&r, "f32_f32", [3]uint32{1, 1, 1}, [3]uint32{32, 1, 1}, 0, nil); err == nil {
		t.Fatal("a nil struct launched")
	}
}

// TestAlignedStructLayout: a struct __align__(64) (gpukit_tmap, a
// CUtensorMap) keeps C's offsets in Go, which aligns to 8 at most: gen.go
// pads before the fields and at the end that C aligns further.
func TestAlignedStructLayout(t *testing.T) {
	var a ConvTmaArgs
	if off := [3]uintptr{unsafe.Offsetof(a.Tx), unsafe.Offsetof(a.Tw), unsafe.Offsetof(a.A)}; off != [3]uintptr{0, 128, 256} {
		t.Fatalf("offsets of tx, tw, a: %v, want C's 0, 128, 256", off)
	}
	if unsafe.Sizeof(a) != 384 || unsafe.Sizeof(GpukitTmap{}) != 128 {
		t.Fatalf("sizes %d and %d, want 384 and 128", unsafe.Sizeof(a), unsafe.Sizeof(GpukitTmap{}))
	}
}
