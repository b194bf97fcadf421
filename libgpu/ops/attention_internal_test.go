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
	// dimensions; the default (1) runs at D = 64 persistent below
	// attnC3MinT positions and with three consumers (not persistent) from
	// there; modes 5 and 6 run three consumers at D = 64, 6 persistent;
	// never with dropout. Dropout takes attn_fwd_ws in modes 1, 3, 5 and
	// 6. Each instance's tile, block and shared memory follow its
	// consumers.
	type want struct{ persist, c3 [2]bool }
	for mode, w := range map[int][2]want{
		0: {}, 2: {}, 3: {},
		1: {{persist: [2]bool{true, false}}, {c3: [2]bool{true, false}}},
		4: {{persist: [2]bool{true, true}}, {persist: [2]bool{true, true}}},
		5: {{c3: [2]bool{true, false}}, {c3: [2]bool{true, false}}},
		6: {{persist: [2]bool{true, false}, c3: [2]bool{true, false}}, {persist: [2]bool{true, false}, c3: [2]bool{true, false}}},
	} {
		restore := SetAttentionWGMMA(mode)
		for j, tt := range []int{attnC3MinT - 1, attnC3MinT} {
			for i, d := range []int{64, 128} {
				ws := attnWSFor(false, d, tt)
				if ws.persist != w[j].persist[i] || (ws.nc == 3) != w[j].c3[i] {
					t.Errorf("attnWGMode %d, D %d, T %d: %+v, want persistent %v, three consumers %v", mode, d, tt, ws, w[j].persist[i], w[j].c3[i])
				}
				if wd := attnWSFor(true, d, tt); wd.persist || wd.nc != 2 {
					t.Errorf("attnWGMode %d, D %d, T %d: with dropout %+v", mode, d, tt, wd)
				}
				if ws.rows() != 64*ws.nc || ws.threads() != 128*(ws.nc+1) || ws.smem() != uint32((64*ws.nc+4*128)*d*2+1152) {
					t.Errorf("attnWGMode %d, D %d: rows %d, threads %d, smem %d for %d consumers", mode, d, ws.rows(), ws.threads(), ws.smem(), ws.nc)
				}
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
				for _, tt := range []int{attnC3MinT - 1, attnC3MinT} {
					if _, err := launch.AttnFwdWsKernel(attnWSFor(drop, d, tt).inst()); err != nil {
						t.Errorf("attnWGMode %d, dropout %v, D %d, T %d: %v", mode, drop, d, tt, err)
					}
				}
			}
		}
		restore()
	}
}

// TestAttnBwdWSKernels: the backward's passes a graph prefetches follow
// attnBwdWSMode: in mode 2 attn_bwd_dkdv_ws and attn_bwd_dq_ws at both
// head dimensions, in mode 1 (the default) attn_bwd_dq_ws at both and
// attn_bwd_dkdv_ws at D = 64, in mode 0 neither; with dropout their _drop
// instances where attnBwdWSDrop allows, else attn_bwd_*_wg_drop. The
// dK/dV pass's shared memory stays within a block's.
func TestAttnBwdWSKernels(t *testing.T) {
	for _, c := range []struct{ d, want int }{{64, 2*128*64*2 + 6*64*64*2 + 6*64*4 + 1024 + 64},
		{128, 2*128*128*2 + 6*64*128*2 + 6*64*4 + 1024 + 64}} {
		if got := attnBwdWSSmem(c.d); got != uint32(c.want) || got > 227*1024 {
			t.Errorf("D %d: shared memory %d, want %d within a block's", c.d, got, c.want)
		}
	}
	for _, wsDrop := range []bool{false, true} {
		restoreDrop := SetAttentionBwdWSDrop(wsDrop)
		for mode, ws := range map[int][2][2]bool{0: {}, 1: {{true, true}, {false, true}}, 2: {{true, true}, {true, true}}} {
			restore := SetAttentionBwdWS(mode)
			for i, d := range []int{64, 128} {
				for _, drop := range []bool{false, true} {
					ks := attnKernels(tensor.BF16, d, 4096, drop, true, true)
					var want [2]string
					for p, pass := range []string{"dkdv", "dq"} {
						inst := attnD(d)
						if drop {
							inst = "drop_" + inst
						}
						kind := "_wg_"
						if ws[i][p] && (!drop || wsDrop) {
							kind = "_ws_"
						}
						want[p] = "attn_bwd_" + pass + kind + inst
					}
					if len(ks) < 3 || ks[1].Name != want[0] || ks[2].Name != want[1] {
						t.Errorf("mode %d, ws with dropout %v, D %d, dropout %v: kernels %v, want %v second and third", mode, wsDrop, d, drop, ks, want)
					}
				}
			}
			restore()
		}
		restoreDrop()
	}
}

// TestAttnWide: head dimension 256 runs attn_fwd_ws_d256 in every
// attnWGMode — two consumers, never persistent, key tiles of 64, its
// shared memory within the 227 KiB a block can have — and a graph
// prefetches it, a forward only, where attnWide allows it (bf16, no
// dropout, sm_90a).
func TestAttnWide(t *testing.T) {
	for _, mode := range []int{0, 1, 2, 3, 4, 5, 6} {
		restore := SetAttentionWGMMA(mode)
		w := attnWSFor(false, attnWideD, 4096)
		if w.inst() != "d256" || w.keys() != 64 || w.rows() != 128 || w.threads() != 384 {
			t.Errorf("attnWGMode %d: %+v (%s, %d keys a tile)", mode, w, w.inst(), w.keys())
		}
		if w.smem() != (128+4*64)*256*2+1152 || w.smem() > 227*1024 {
			t.Errorf("attnWGMode %d: shared memory %d", mode, w.smem())
		}
		if _, err := launch.AttnFwdWsKernel(w.inst()); err != nil {
			t.Error(err)
		}
		restore()
	}
	for _, on := range []bool{false, true} {
		restore := SetAttentionWide(on)
		for _, c := range []struct {
			dt         tensor.DType
			drop, wg   bool
			wantKernel bool
		}{{tensor.BF16, false, true, true}, {tensor.BF16, true, true, false}, {tensor.F32, false, true, false}, {tensor.BF16, false, false, false}} {
			ks := attnKernels(c.dt, attnWideD, 1024, c.drop, c.wg && attnWGOn(attnWideD, 1024), true)
			want := on && c.wantKernel
			if got := len(ks) == 2 && ks[0].Name == "attn_fwd_ws_d256" && ks[1] == attnWGMarker; got != want || !want && len(ks) > 0 {
				t.Errorf("attnWide %v, %v, dropout %v, sm_90a %v: kernels %v", on, c.dt, c.drop, c.wg, ks)
			}
		}
		restore()
	}
}
