package ops

import (
	"testing"

	"gpukit/libgpu/kernels/launch"
)

// TestAttnPersistentGrid: the persistent forward's grid is one block per
// multiprocessor, or one per tile when there are fewer tiles, and at least
// one block; each mode takes attn_fwd_ws where it should, and the instance
// attnWSInst names exists.
func TestAttnPersistentGrid(t *testing.T) {
	for _, c := range []struct {
		g    [3]uint32
		sms  int
		want uint32
	}{
		{[3]uint32{16, 8, 16}, 132, 132},
		{[3]uint32{2, 1, 3}, 132, 6},
		{[3]uint32{1, 1, 1}, 132, 1},
		{[3]uint32{65535, 65535, 64}, 132, 132}, // the tile count overflows 32 bits
		{[3]uint32{4, 4, 4}, 0, 1},
	} {
		if got := attnPersistentGrid(c.g, c.sms); got != [3]uint32{c.want, 1, 1} {
			t.Errorf("grid %v on %d SMs: %v, want [%d 1 1]", c.g, c.sms, got, c.want)
		}
	}
	// Mode 4 is the persistent warp-specialised forward at both head
	// dimensions, the default (1) at D = 64, never with dropout; dropout
	// takes attn_fwd_ws in modes 1 and 3.
	for mode, want := range map[int][2]bool{0: {}, 1: {true, false}, 2: {}, 3: {}, 4: {true, true}} {
		restore := SetAttentionWGMMA(mode)
		for i, d := range []int{64, 128} {
			if got := attnWSPersistent(false, d); got != want[i] {
				t.Errorf("attnWGMode %d, D %d: persistent %v, want %v", mode, d, got, want[i])
			}
			if attnWSPersistent(true, d) {
				t.Errorf("attnWGMode %d, D %d: persistent with dropout", mode, d)
			}
		}
		if got := attnWSOn(false); got != (mode == 1 || mode >= 3) {
			t.Errorf("attnWGMode %d: attn_fwd_ws %v without dropout", mode, got)
		}
		if got := attnWSOn(true); got != (mode == 1 || mode == 3) {
			t.Errorf("attnWGMode %d: attn_fwd_ws %v with dropout", mode, got)
		}
		// The instance launched is one attention.cu defines.
		for _, drop := range []bool{false, true} {
			if !attnWSOn(drop) {
				continue
			}
			for _, d := range []int{64, 128} {
				if _, err := launch.AttnFwdWsKernel(attnWSInst(drop, d)); err != nil {
					t.Errorf("attnWGMode %d, dropout %v, D %d: %v", mode, drop, d, err)
				}
			}
		}
		restore()
	}
}
