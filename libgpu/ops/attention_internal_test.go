package ops

import (
	"testing"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// TestAttnPersistentGrid: the persistent forward's grid is one block per
// multiprocessor, or one per tile when there are fewer tiles, and at least
// one block; each mode takes attn_fwd_ws where it should, and the instance
// attnWSFor names exists.
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
	// dimensions, the default (1) at D = 64, mode 6 at D = 64, never with
	// dropout; modes 5 and 6 run three consumers at D = 64 without
	// dropout; dropout takes attn_fwd_ws in modes 1, 3, 5 and 6. Each
	// instance's tile, block and shared memory follow its consumers.
	type want struct{ persist, c3 [2]bool }
	for mode, w := range map[int]want{0: {}, 1: {persist: [2]bool{true, false}}, 2: {}, 3: {},
		4: {persist: [2]bool{true, true}}, 5: {c3: [2]bool{true, false}},
		6: {persist: [2]bool{true, false}, c3: [2]bool{true, false}}} {
		restore := SetAttentionWGMMA(mode)
		for i, d := range []int{64, 128} {
			ws := attnWSFor(false, d)
			if ws.persist != w.persist[i] || (ws.nc == 3) != w.c3[i] {
				t.Errorf("attnWGMode %d, D %d: %+v, want persistent %v, three consumers %v", mode, d, ws, w.persist[i], w.c3[i])
			}
			if wd := attnWSFor(true, d); wd.persist || wd.nc != 2 {
				t.Errorf("attnWGMode %d, D %d: with dropout %+v", mode, d, wd)
			}
			if ws.rows() != 64*ws.nc || ws.threads() != 128*(ws.nc+1) || ws.smem() != uint32((64*ws.nc+4*128)*d*2+1152) {
				t.Errorf("attnWGMode %d, D %d: rows %d, threads %d, smem %d for %d consumers", mode, d, ws.rows(), ws.threads(), ws.smem(), ws.nc)
			}
		}
		if got := attnWSOn(false); got != (mode == 1 || mode >= 3) {
			t.Errorf("attnWGMode %d: attn_fwd_ws %v without dropout", mode, got)
		}
		if got := attnWSOn(true); got != (mode == 1 || mode == 3 || mode >= 5) {
			t.Errorf("attnWGMode %d: attn_fwd_ws %v with dropout", mode, got)
		}
		// The instance launched is one attention.cu defines.
		for _, drop := range []bool{false, true} {
			if !attnWSOn(drop) {
				continue
			}
			for _, d := range []int{64, 128} {
				if _, err := launch.AttnFwdWsKernel(attnWSFor(drop, d).inst()); err != nil {
					t.Errorf("attnWGMode %d, dropout %v, D %d: %v", mode, drop, d, err)
				}
			}
		}
		restore()
	}
}

// TestAttnBwdWSKernels: with attnBwdWS the backward's passes a graph
// prefetches are attn_bwd_dkdv_ws and attn_bwd_dq_ws at both head
// dimensions, without dropout only.
func TestAttnBwdWSKernels(t *testing.T) {
	defer SetAttentionBwdWS(true)()
	for _, d := range []int{64, 128} {
		for _, drop := range []bool{false, true} {
			ks := attnKernels(tensor.BF16, d, drop, true, true)
			want := [2]string{"attn_bwd_dkdv_wg_drop_" + attnD(d), "attn_bwd_dq_wg_drop_" + attnD(d)}
			if !drop {
				want = [2]string{"attn_bwd_dkdv_ws_" + attnD(d), "attn_bwd_dq_ws_" + attnD(d)}
			}
			if len(ks) < 3 || ks[1].Name != want[0] || ks[2].Name != want[1] {
				t.Errorf("D %d, dropout %v: kernels %v, want %v second and third", d, drop, ks, want)
			}
		}
	}
}
