package ops_test

import (
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// gptCastShapes are the f32 master weights a GPT step (6 layers, d 384,
// vocabulary 65, no biases) casts to bf16 under autocast: per layer
// c_attn [1152, 384], attn.c_proj [384, 384], c_fc [1536, 384] and
// mlp.c_proj [384, 1536], and the tied head [65, 384]: 10.6 M elements,
// 63.9 MB to move (4 bytes read, 2 written per element).
func gptCastShapes() [][2]int {
	var s [][2]int
	for l := 0; l < 6; l++ {
		s = append(s, [2]int{1152, 384}, [2]int{384, 384}, [2]int{1536, 384}, [2]int{384, 1536})
	}
	return append(s, [2]int{65, 384})
}

// BenchmarkCUDACasts times the GPT's weight casts: "multi" is one
// Engine.Casts (one launch), "each" one Engine.Cast per weight (the old
// way: 25 launches). Predicted on an H100: multi 24 µs (the byte floor at
// 3 TB/s: 21 µs); each about 150 µs (ncu: 148 µs for 19 launches).
func BenchmarkCUDACasts(b *testing.B) {
	d := gpu(b)
	e := cudaEngine(b, d, ops.PrecTF32)
	r := rand.New(rand.NewPCG(1, 2))
	var bytes int64
	for _, sh := range gptCastShapes() {
		bytes += int64(sh[0] * sh[1] * 6)
	}
	var multi, each []func() error
	for i := 0; i < benchSets(bytes); i++ {
		var dst, src []*tensor.Tensor
		for _, sh := range gptCastShapes() {
			src = append(src, benchRand(b, e, r, tensor.F32, 0.02, 0, sh[0], sh[1]))
			dst = append(dst, benchEmpty(b, e, tensor.BF16, sh[0], sh[1]))
		}
		multi = append(multi, func() error { return e.Casts(dst, src) })
		each = append(each, func() error {
			for j := range dst {
				if err := e.Cast(dst[j], src[j]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	b.Run("multi/gpt-weights/f32-bf16", func(b *testing.B) { benchGraph(b, e, multi, bytes) })
	b.Run("each/gpt-weights/f32-bf16", func(b *testing.B) { benchGraph(b, e, each, bytes) })
}
