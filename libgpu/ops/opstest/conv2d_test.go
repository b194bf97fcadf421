package opstest

import (
	"math/rand/v2"
	"testing"
)

// TestRefConv2DDilatedGrouped holds the dilated, grouped references to the
// plain ones (d = 1, G = 1), which they must equal on the dense filters
// that spell the same convolution out: the taps spread d apart with zeros
// between them (KH' = d·(KH−1)+1), every input channel present with zeros
// outside the output channel's group. The nonzero terms are met in the
// same order, so forward, dx and db agree bit for bit, and dw is the dense
// dw at the kept taps and channels.
func TestRefConv2DDilatedGrouped(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, g := range convGeoms {
		if g.Dil() == 1 && g.Groups() == 1 {
			continue
		}
		d, cig, cog := g.Dil(), g.CinG(), g.Cout/g.Groups()
		dense := ConvGeom{N: g.N, H: g.H, W: g.W, Cin: g.Cin, Cout: g.Cout, KH: d*(g.KH-1) + 1, KW: d*(g.KW-1) + 1, S: g.S, P: g.P}
		ho, wo := g.Out()
		if dh, dwo := dense.Out(); dh != ho || dwo != wo {
			t.Fatalf("%s: output %d×%d, the dense filters' %d×%d", g.name(), ho, wo, dh, dwo)
		}
		x := F64(Rand(r, g.N*g.H*g.W*g.Cin))
		w := F64(Rand(r, g.Cout*g.KH*g.KW*cig))
		b := F64(Rand(r, g.Cout))
		dy := F64(Rand(r, g.N*ho*wo*g.Cout))
		// at is the index in the dense filters of w's element (o, kh, kw, c).
		at := func(o, kh, kw, c int) int {
			return ((o*dense.KH+kh*d)*dense.KW+kw*d)*g.Cin + o/cog*cig + c
		}
		wd := make([]float64, g.Cout*dense.KH*dense.KW*g.Cin)
		for o := 0; o < g.Cout; o++ {
			for kh := 0; kh < g.KH; kh++ {
				for kw := 0; kw < g.KW; kw++ {
					for c := 0; c < cig; c++ {
						wd[at(o, kh, kw, c)] = w[((o*g.KH+kh)*g.KW+kw)*cig+c]
					}
				}
			}
		}
		same := func(what string, got, want []float64) {
			t.Helper()
			if len(got) != len(want) {
				t.Fatalf("%s %s: %d values, want %d", g.name(), what, len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%s %s[%d] = %v, the dense filters' %v", g.name(), what, i, got[i], want[i])
				}
			}
		}
		same("y", RefConv2D(x, w, b, g), RefConv2D(x, wd, b, dense))
		dx, dw, db := RefConv2DBackward(dy, x, w, g)
		ddx, ddw, ddb := RefConv2DBackward(dy, x, wd, dense)
		same("dx", dx, ddx)
		same("db", db, ddb)
		kept := make([]float64, len(dw))
		for o := 0; o < g.Cout; o++ {
			for kh := 0; kh < g.KH; kh++ {
				for kw := 0; kw < g.KW; kw++ {
					for c := 0; c < cig; c++ {
						kept[((o*g.KH+kh)*g.KW+kw)*cig+c] = ddw[at(o, kh, kw, c)]
					}
				}
			}
		}
		same("dw", dw, kept)
	}
}
