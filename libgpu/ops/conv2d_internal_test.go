package ops

import "testing"

// TestConvPathFromEnv: GPUKIT_CONV_PATH's values choose the path; anything
// else leaves wgmma, the default.
func TestConvPathFromEnv(t *testing.T) {
	for v, want := range map[string]int{"": convWG, "mma": convMMA, "wg": convWG, "im2col": convIm2col, "WG": convWG, "cudnn": convWG} {
		if got := convPathFromEnv(v); got != want {
			t.Errorf("GPUKIT_CONV_PATH=%q: path %d, want %d", v, got, want)
		}
	}
	// The backward: wgmma unless GPUKIT_CONV_BWD, or else
	// GPUKIT_CONV_PATH, names a path.
	for _, c := range []struct {
		path, bwd string
		want      int
	}{{"", "", convWG}, {"mma", "", convMMA}, {"im2col", "", convIm2col}, {"", "mma", convMMA}, {"wg", "mma", convMMA}, {"mma", "wg", convWG}, {"x", "y", convWG}} {
		if got := convBwdPathFromEnv(c.path, c.bwd); got != c.want {
			t.Errorf("GPUKIT_CONV_PATH=%q GPUKIT_CONV_BWD=%q: backward path %d, want %d", c.path, c.bwd, got, c.want)
		}
	}
}

// TestGNChunks: the split GroupNorm forward covers every row exactly once
// with chunks of at least max(gnSplitRows, by) rows, and keeps one block
// per sample when the samples alone fill two waves.
func TestGNChunks(t *testing.T) {
	for _, c := range []struct{ n, s, sms, by, k int }{
		{2, 4096, 132, 32, 64}, {4, 1024, 132, 32, 16}, {4, 64, 132, 32, 1}, {512, 1024, 132, 32, 1},
		{2, 1000, 132, 32, 15}, {1, 100, 132, 128, 1}, {3, 130, 132, 8, 2},
	} {
		chunk, k := gnChunks(c.n, c.s, c.sms, c.by)
		if k != c.k || (k-1)*chunk >= c.s || k*chunk < c.s || (k > 1 && chunk < max(gnSplitRows, c.by)) {
			t.Errorf("N %d S %d: chunk %d × %d blocks, want %d blocks covering %d rows", c.n, c.s, chunk, k, c.k, c.s)
		}
	}
}
