package ops_test

import (
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// benchGraph times the element-wise and row-wise kernels the way a
// training step runs them: reps launches, cycling over the problem sets
// ops (each with buffers of its own, so that repeated launches do not find
// their inputs in L2: give enough sets that they exceed its 50 MB on an
// H100), captured into one CUDA graph and replayed b.N times. Each op is
// run eagerly once first (kernel compilation, scratch buffers). Metrics:
// µs per op, and GB/s from bytes, the bytes one op must move (each input
// read once, each output written once).
func benchGraph(b *testing.B, e *ops.Engine, ops []func() error, bytes int64) {
	b.Helper()
	const reps = 24
	for _, op := range ops {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	g, err := e.Capture(func() error {
		for i := 0; i < reps; i++ {
			if err := ops[i%len(ops)](); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	if err := g.Launch(); err != nil { // warm
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
	per := b.Elapsed().Seconds() / float64(b.N*reps)
	b.ReportMetric(per*1e6, "µs/op")
	b.ReportMetric(float64(bytes)/per/1e9, "GB/s")
}

// benchSets is how many problem sets of setBytes each benchGraph needs so
// that together they exceed 128 MB (L2 is 50 MB on an H100, 60 on an
// H200), at least 2.
func benchSets(setBytes int64) int {
	return max(2, int((128<<20+setBytes-1)/setBytes))
}

// benchRand allocates a tensor filled with draws from U(shift − scale,
// shift + scale) from r (random data, never zeros: METHOD.md).
func benchRand(tb testing.TB, e *ops.Engine, r *rand.Rand, dt tensor.DType, scale, shift float32, shape ...int) *tensor.Tensor {
	tb.Helper()
	t := opstest.Empty(tb, device.Local{Dev: e.Device()}, dt, shape...)
	v := opstest.Rand(r, t.Numel())
	for i := range v {
		v[i] = scale*v[i] + shift
	}
	if err := t.WriteFloat32(v); err != nil {
		tb.Fatal(err)
	}
	return t
}

// benchEmpty allocates a NaN-poisoned tensor.
func benchEmpty(tb testing.TB, e *ops.Engine, dt tensor.DType, shape ...int) *tensor.Tensor {
	tb.Helper()
	return opstest.Empty(tb, device.Local{Dev: e.Device()}, dt, shape...)
}
