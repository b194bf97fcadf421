package nn

import (
	"math/rand/v2"
	"testing"
)

// TestMLPStepFLOPs: 6·batch·(weights) − 2·batch·(first layer's weights),
// the usual 6N-per-example rule less the input gradient nobody needs.
func TestMLPStepFLOPs(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for range 20 {
		ws := make([]int, 2+r.IntN(4))
		for i := range ws {
			ws[i] = 1 + r.IntN(5000)
		}
		b := 1 + r.IntN(4096)
		weights := 0
		for i := 0; i+1 < len(ws); i++ {
			weights += ws[i] * ws[i+1]
		}
		want := 6*float64(b)*float64(weights) - 2*float64(b)*float64(ws[0]*ws[1])
		if got := MLPStepFLOPs(ws, b); got != want {
			t.Fatalf("%v batch %d: %g, want %g", ws, b, got, want)
		}
	}
}
