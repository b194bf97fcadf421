package ops

// CUDAWhilePTX reports whether e's condition kernel was loaded from PTX
// (the fallback when NVRTC's cubin did not resolve cudaGraphSetConditional).
func CUDAWhilePTX(e *Engine) bool {
	c, ok := e.impl.(*cudaImpl)
	return ok && c.while.module != 0
}
