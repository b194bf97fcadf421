package ops

// Convolution kernel paths for SetConvPath (convPath).
const (
	ConvMMA    = convMMA    // the default: mma.sync implicit GEMM where the shape allows, else im2col
	ConvWG     = convWG     // wgmma on sm_90a where the shape allows, else as ConvMMA
	ConvIm2col = convIm2col // im2col + cuBLASLt
)

// SetConvImplicit turns the implicit-GEMM convolutions on (ConvMMA) or
// off (ConvIm2col: im2col + cuBLASLt) for CUDA convolutions from now on
// and returns a func that restores the previous setting.
func SetConvImplicit(on bool) (restore func()) {
	if on {
		return SetConvPath(ConvMMA)
	}
	return SetConvPath(ConvIm2col)
}

// SetConvPath chooses the kernels of bf16 CUDA convolutions, forward and
// backward, from now on (ConvMMA, ConvWG, ConvIm2col) and returns a func
// that restores the previous choice.
func SetConvPath(p int) (restore func()) {
	old, oldBwd := convPath, convBwdPath
	convPath, convBwdPath = p, p
	return func() { convPath, convBwdPath = old, oldBwd }
}

// ConvHopper reports whether e's CUDA backend runs conv_wg_fwd.
func ConvHopper(e *Engine) bool {
	return e.c != nil && e.c.convHopper()
}

// SetConvTune turns the per-shape timing of convolution paths (forward and
// both backward passes) on or off from now on and returns a func that restores the previous setting.
func SetConvTune(on bool) (restore func()) {
	return setVar(&convTune, on)
}

// SetConvFuseKernels lets Conv2DFused run on its fused kernels on CUDA (or
// not) from now on and returns a func that restores the previous setting.
func SetConvFuseKernels(on bool) (restore func()) {
	return setVar(&convFuseKernels, on)
}

// SetConvWS turns the warp-specialised wgmma forward (convWS) on or off
// and returns a func that restores the previous setting.
func SetConvWS(on bool) (restore func()) {
	return setVar(&convWS, on)
}

// SetConvTMA turns the wgmma forward with TMA loads (convTMA) on or off
// and returns a func that restores the previous setting.
func SetConvTMA(on bool) (restore func()) {
	return setVar(&convTMA, on)
}
