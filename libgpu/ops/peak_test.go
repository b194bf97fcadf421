package ops_test

import (
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
)

type namedCUDA struct {
	*device.Host
	name string
}

func (namedCUDA) Kind() device.Kind { return device.KindCUDA }
func (n namedCUDA) String() string  { return n.name }

// TestPeakFLOPS: the table answers by device name (the more specific entry
// first), orders precisions f32 < TF32 < BF16, and has nothing for the host
// or an unknown GPU.
func TestPeakFLOPS(t *testing.T) {
	h := device.NewHost()
	if _, ok := ops.PeakFLOPS(h, ops.PrecTF32); ok {
		t.Fatal("a peak for the host")
	}
	if _, ok := ops.PeakFLOPS(namedCUDA{h, "cuda:0 Some GPU (sm_12)"}, ops.PrecTF32); ok {
		t.Fatal("a peak for an unknown GPU")
	}
	sxm, _ := ops.PeakFLOPS(namedCUDA{h, "cuda:0 NVIDIA H100 80GB HBM3 (sm_90)"}, ops.PrecBF16)
	pcie, _ := ops.PeakFLOPS(namedCUDA{h, "cuda:0 NVIDIA H100 PCIe (sm_90)"}, ops.PrecBF16)
	if !(pcie > 0 && pcie < sxm) {
		t.Fatalf("H100 PCIe bf16 %g, SXM %g", pcie, sxm)
	}
	for _, name := range []string{"cuda:0 NVIDIA H200 (sm_90)", "cuda:1 NVIDIA H100 80GB HBM3 (sm_90)", "cuda:0 NVIDIA A100-SXM4-80GB (sm_80)"} {
		d := namedCUDA{h, name}
		f, ok1 := ops.PeakFLOPS(d, ops.PrecF32)
		tf, ok2 := ops.PeakFLOPS(d, ops.PrecTF32)
		b, ok3 := ops.PeakFLOPS(d, ops.PrecBF16)
		if !ok1 || !ok2 || !ok3 || !(0 < f && f < tf && tf < b) {
			t.Errorf("%s: f32 %g, tf32 %g, bf16 %g", name, f, tf, b)
		}
	}
}
