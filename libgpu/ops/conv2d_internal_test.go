package ops

import "testing"

// TestConvPathFromEnv: GPUKIT_CONV_PATH's values choose the path; anything
// else leaves mma.sync, the default.
func TestConvPathFromEnv(t *testing.T) {
	for v, want := range map[string]int{"": convMMA, "mma": convMMA, "wg": convWG, "im2col": convIm2col, "WG": convMMA, "cudnn": convMMA} {
		if got := convPathFromEnv(v); got != want {
			t.Errorf("GPUKIT_CONV_PATH=%q: path %d, want %d", v, got, want)
		}
	}
}
