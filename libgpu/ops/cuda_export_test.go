package ops

import "gpukit/libgpu/cuda"

// SetCUDAFusion turns cuBLASLt epilogue fusion on or off for CUDA engines
// made afterwards and returns a func that restores the previous setting.
func SetCUDAFusion(on bool) (restore func()) {
	return setVar(&cudaFusion, on)
}

// CUDARejectedEpilogues lists the GEMM specs whose fused epilogue cuBLASLt
// refused in e (nil for a non-CUDA engine).
func CUDARejectedEpilogues(e *Engine) map[cuda.GemmSpec]error {
	if e.c != nil {
		return e.c.rejectedEpilogues()
	}
	return nil
}

// SetQRLanes sets how many streams QR and Eigh spread their matrices over
// on CUDA
// and returns a func that restores the previous count.
func SetQRLanes(n int) (restore func()) {
	return setVar(&solverLaneCount, n)
}
