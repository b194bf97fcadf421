package ops

import "gpukit/libgpu/cuda"

// SetCUDAFusion turns cuBLASLt epilogue fusion on or off for CUDA engines
// made afterwards and returns a func that restores the previous setting.
func SetCUDAFusion(on bool) (restore func()) {
	old := cudaFusion
	cudaFusion = on
	return func() { cudaFusion = old }
}

// CUDARejectedEpilogues lists the GEMM specs whose fused epilogue cuBLASLt
// refused in e (nil for a non-CUDA engine).
func CUDARejectedEpilogues(e *Engine) map[cuda.GemmSpec]error {
	if c, ok := e.impl.(*cudaImpl); ok {
		return c.RejectedEpilogues()
	}
	return nil
}

// CommStreamPriority is the priority of e's communication stream (made by
// its first CommSide) and the context's greatest priority.
func CommStreamPriority(e *Engine) (prio, greatest int, err error) {
	c := e.impl.(*cudaImpl)
	err = c.dev.Do(func() error {
		var err error
		if prio, err = c.comm.stream.Priority(); err != nil {
			return err
		}
		_, greatest, err = cuda.StreamPriorityRange()
		return err
	})
	return prio, greatest, err
}
