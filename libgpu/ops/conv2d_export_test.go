package ops

// SetConvImplicit turns the implicit-GEMM convolution on or off (else
// im2col + cuBLASLt) for CUDA convolutions from now on and returns a func
// that restores the previous setting.
func SetConvImplicit(on bool) (restore func()) {
	old := convImplicit
	convImplicit = on
	return func() { convImplicit = old }
}
