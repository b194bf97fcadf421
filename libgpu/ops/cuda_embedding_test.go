package ops_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// skewedIndices draws n indices in [0, v) with a heavy head (u³·v: a
// third of them in the first 3% of the vocabulary), so the backward's
// runs of equal indices are long, as a text's are.
func skewedIndices(r *rand.Rand, n, v int) []int32 {
	ix := make([]int32, n)
	for i := range ix {
		u := r.Float64()
		ix[i] = int32(min(int(u*u*u*float64(v)), v-1))
	}
	return ix
}

// embedShapes are the GPT shapes: nanoGPT's shakespeare-char (V 65, C 384,
// batch 64 × block 256) and GPT-2 small's vocabulary (V 50257, C 768).
var embedShapes = []struct{ v, c, n int }{{65, 384, 16384}, {50257, 768, 16384}}

// TestCUDAEmbeddingLarge runs the embedding at the GPT shapes (bf16
// activations, an f32 table and gradient): the forward is exact, the
// backward matches the float64 scatter-add, is bitwise the same on every
// run, and accumulates.
func TestCUDAEmbeddingLarge(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecBF16)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(rand.Uint64(), 11))
	// And GPT-2 XL's width (C 1600: two column blocks in the backward).
	shapes := append(embedShapes[:len(embedShapes):len(embedShapes)], struct{ v, c, n int }{50257, 1600, 4096})
	for _, sh := range shapes {
		t.Run(fmt.Sprintf("V=%d,C=%d,N=%d", sh.v, sh.c, sh.n), func(t *testing.T) {
			ix := skewedIndices(r, sh.n, sh.v)
			idx := opstest.UploadI32(t, a, ix, 64, sh.n/64)
			tv := opstest.Rand(r, sh.v*sh.c)
			table := opstest.Upload(t, a, tv, sh.v, sh.c)
			y := opstest.Empty(t, a, tensor.BF16, 64, sh.n/64, sh.c)
			if err := e.Embedding(y, table, idx); err != nil {
				t.Fatal(err)
			}
			want := opstest.RefEmbedding(opstest.F64(tv), ix, sh.c)
			got := syncReadFloats(t, e, y)
			if err := opstest.TermsErr(got, opstest.F64(tensor.RoundBF16(opstest.F32(want))), nil); err != 0 {
				t.Fatalf("forward: relative error %.3g, want 0", err)
			}
			dy := opstest.Empty(t, a, tensor.BF16, 64, sh.n/64, sh.c)
			dyv := tensor.RoundBF16(opstest.Rand(r, sh.n*sh.c))
			if err := dy.WriteFloat32(dyv); err != nil {
				t.Fatal(err)
			}
			dt := opstest.Empty(t, a, tensor.F32, sh.v, sh.c)
			var first []byte
			for run := 0; run < 3; run++ {
				if err := e.EmbeddingBackward(dt, dy, idx, false); err != nil {
					t.Fatal(err)
				}
				b := syncReadBytes(t, e, dt)
				if run == 0 {
					first = b
					continue
				}
				if !bytes.Equal(b, first) {
					t.Fatalf("backward run %d differs from run 0", run)
				}
			}
			ref := opstest.RefEmbeddingBackward(opstest.F64(dyv), ix, sh.v, sh.c, nil)
			if err := opstest.TermsErr(syncReadFloats(t, e, dt), ref, nil); !(err <= 1e-5) {
				t.Fatalf("backward: relative error %.3g", err)
			}
			// Accumulate: dtable += the same sums (twice the reference).
			if err := e.EmbeddingBackward(dt, dy, idx, true); err != nil {
				t.Fatal(err)
			}
			for i := range ref {
				ref[i] *= 2
			}
			if err := opstest.TermsErr(syncReadFloats(t, e, dt), ref, nil); !(err <= 1e-5) {
				t.Fatalf("backward (acc): relative error %.3g", err)
			}
		})
	}
}

// TestCUDAEmbeddingGraphMatchesEager: forward and backward (overwrite
// and accumulate) captured once and replayed give bitwise the eager
// results.
func TestCUDAEmbeddingGraphMatchesEager(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecBF16)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(rand.Uint64(), 12))
	const v, c, n = 300, 40, 5000
	ix := skewedIndices(r, n, v)
	idx := opstest.UploadI32(t, a, ix, n)
	table := opstest.Upload(t, a, opstest.Rand(r, v*c), v, c)
	dy := opstest.Upload(t, a, opstest.Rand(r, n*c), n, c)
	y := opstest.Empty(t, a, tensor.BF16, n, c)
	dt := opstest.Empty(t, a, tensor.F32, v, c)
	step := func() error {
		if err := e.Embedding(y, table, idx); err != nil {
			return err
		}
		if err := e.EmbeddingBackward(dt, dy, idx, false); err != nil {
			return err
		}
		return e.EmbeddingBackward(dt, dy, idx, true)
	}
	if err := step(); err != nil {
		t.Fatal(err)
	}
	wantY, wantD := syncReadBytes(t, e, y), syncReadBytes(t, e, dt)
	for _, x := range []*tensor.Tensor{y, dt} {
		if err := opstest.Poison(x); err != nil {
			t.Fatal(err)
		}
	}
	g, err := e.Capture(step)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i := 0; i < 3; i++ {
		if err := g.Launch(); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(syncReadBytes(t, e, y), wantY) || !bytes.Equal(syncReadBytes(t, e, dt), wantD) {
		t.Fatal("graph replay differs from eager")
	}
}

// syncReadBytes waits for the engine and reads t's bytes.
func syncReadBytes(tb testing.TB, e *ops.Engine, t *tensor.Tensor) []byte {
	tb.Helper()
	if err := e.Sync(); err != nil {
		tb.Fatal(err)
	}
	b, err := t.Read()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// syncReadFloats waits for the engine and reads a float tensor as float64.
func syncReadFloats(tb testing.TB, e *ops.Engine, t *tensor.Tensor) []float64 {
	tb.Helper()
	if err := e.Sync(); err != nil {
		tb.Fatal(err)
	}
	v, err := t.ReadFloat32()
	if err != nil {
		tb.Fatal(err)
	}
	return opstest.F64(v)
}

// benchGraphReplay times f (queued ops) replayed from a CUDA graph of calls
// copies of it, after one eager warm-up, and reports µs per call and the
// bandwidth of bytes per call. Graph replay keeps the host's launch cost
// out of the figure, as in a captured training step.
func benchGraphReplay(b *testing.B, e *ops.Engine, calls int, bytes int64, f func() error) {
	b.Helper()
	if err := f(); err != nil {
		b.Fatal(err)
	}
	g, err := e.Capture(func() error {
		for i := 0; i < calls; i++ {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	if err := g.Launch(); err != nil {
		b.Fatal(err)
	}
	if err := e.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := g.Launch(); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Sync(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	per := b.Elapsed().Seconds() / float64(b.N*calls)
	b.ReportMetric(per*1e6, "us/call")
	b.ReportMetric(float64(bytes)/per/1e9, "GB/s")
}

// BenchmarkCUDAEmbedding times the embedding at the GPT shapes: the
// forward (f32 table → bf16 rows) and the backward (bf16 dy → f32 dtable,
// overwritten: zeroing, sort, run sums; or accumulated). GB/s counts the bytes that must
// move: forward 2·N·C (write) + N·C·4 (rows read), backward N·C·2 (dy) +
// V·C·4 (dtable written).
func BenchmarkCUDAEmbedding(b *testing.B) {
	d := gpu(b)
	e := cudaEngine(b, d, ops.PrecBF16)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(1, 2))
	for _, sh := range embedShapes {
		ix := skewedIndices(r, sh.n, sh.v)
		idx := opstest.UploadI32(b, a, ix, sh.n)
		table := opstest.Upload(b, a, opstest.Rand(r, sh.v*sh.c), sh.v, sh.c)
		y := opstest.Empty(b, a, tensor.BF16, sh.n, sh.c)
		dt := opstest.Empty(b, a, tensor.F32, sh.v, sh.c)
		nc := int64(sh.n * sh.c)
		b.Run(fmt.Sprintf("forward/V=%d,C=%d,N=%d", sh.v, sh.c, sh.n), func(b *testing.B) {
			benchGraphReplay(b, e, 10, nc*6, func() error { return e.Embedding(y, table, idx) })
		})
		b.Run(fmt.Sprintf("backward/V=%d,C=%d,N=%d", sh.v, sh.c, sh.n), func(b *testing.B) {
			benchGraphReplay(b, e, 10, nc*2+int64(sh.v*sh.c)*4, func() error { return e.EmbeddingBackward(dt, y, idx, false) })
		})
		// Accumulating (a tied table whose gradient the lm_head's GEMM
		// wrote first): no zeroing pass; the bytes are dy and a read and
		// write of each row some index names.
		uniq := map[int32]bool{}
		for _, k := range ix {
			uniq[k] = true
		}
		b.Run(fmt.Sprintf("backward-acc/V=%d,C=%d,N=%d", sh.v, sh.c, sh.n), func(b *testing.B) {
			benchGraphReplay(b, e, 10, nc*2+int64(len(uniq)*sh.c)*8, func() error { return e.EmbeddingBackward(dt, y, idx, true) })
		})
	}
}
