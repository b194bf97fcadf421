package ops

import (
	"strings"

	"gpukit/libgpu/device"
)

// peak is one GPU model's dense peak throughput in FLOP/s for f32 on CUDA
// cores, TF32 and BF16 on tensor cores (no structured sparsity), from
// NVIDIA's data sheets: "NVIDIA H100 Tensor Core GPU" (SXM5, PCIe and NVL
// columns), "NVIDIA H200 Tensor Core GPU" (SXM and NVL) and "NVIDIA A100
// Tensor Core GPU". The data sheets quote tensor-core figures with
// sparsity; the dense figures are half of those.
type peak struct {
	match          string // substring of the device name, most specific first
	f32, tf32, b16 float64
}

var peaks = []peak{
	{"H200 NVL", 60e12, 417.5e12, 835.5e12},
	{"H200", 67e12, 494.5e12, 989.5e12},
	{"H100 NVL", 60e12, 417.5e12, 835.5e12},
	{"H100 PCIe", 51e12, 378e12, 756e12},
	{"H100", 67e12, 494.5e12, 989.5e12}, // SXM5 (H100 80GB HBM3)
	{"A100", 19.5e12, 156e12, 312e12},
}

// PeakFLOPS is dev's dense peak in FLOP/s for GEMMs at precision p (f32 on
// CUDA cores for PrecF32, tensor cores for TF32 and BF16), looked up by the
// device's name in a table of data-sheet figures (H100 SXM/PCIe/NVL, H200
// SXM/NVL, A100). ok is false for the host and for GPUs not in the table.
// Model FLOPs utilisation is achieved FLOP/s divided by this.
func PeakFLOPS(dev device.Device, p Precision) (flops float64, ok bool) {
	if dev == nil || dev.Kind() != device.KindCUDA {
		return 0, false
	}
	name := dev.String()
	for _, pk := range peaks {
		if strings.Contains(name, pk.match) {
			switch p {
			case PrecF32:
				return pk.f32, true
			case PrecTF32:
				return pk.tf32, true
			case PrecBF16:
				return pk.b16, true
			}
			return 0, false
		}
	}
	return 0, false
}
