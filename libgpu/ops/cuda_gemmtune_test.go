package ops_test

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/kernels"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// TestCUDAMatmulTuned: GEMMs large enough to be tuned (a linear layer's
// forward with bias, its data gradient, and its weight gradient with the
// bias gradient, accumulated) give the host backend's results within the
// GEMM tolerance, the choices land in the cache directory's
// gemm-algos.json, and a second engine (as a second process would) reads
// them and computes bitwise the same outputs. (The cache directory is the
// process's: the kernel cache is opened once per process, so a test must
// not move it.)
func TestCUDAMatmulTuned(t *testing.T) {
	d := gpu(t)
	cache, err := kernels.DefaultCacheDir()
	if err != nil {
		t.Fatalf("no cache directory: %v", err)
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 9))
	const m, k, n = 2048, 384, 1536
	host := device.NewHost()
	he, err := ops.NewEngine(host, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(dev device.Device, dt tensor.DType, v []float32, shape ...int) *tensor.Tensor {
		x, err := tensor.Alloc(device.Local{Dev: dev}, "", dt, shape...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Buf.Free() })
		if v != nil {
			if err := x.WriteFloat32(v); err != nil {
				t.Fatal(err)
			}
		} else if err := opstest.Poison(x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	rnd := func(count int) []float32 {
		v := make([]float32, count)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return v
	}
	xv, wv, bv, dyv, dwv := rnd(m*k), rnd(n*k), rnd(n), rnd(m*n), rnd(n*k)
	run := func(e *ops.Engine, dev device.Device) [][]float32 {
		x, w, b := mk(dev, tensor.BF16, xv, m, k), mk(dev, tensor.BF16, wv, n, k), mk(dev, tensor.BF16, bv, n)
		dy := mk(dev, tensor.BF16, dyv, m, n)
		y, dx := mk(dev, tensor.BF16, nil, m, n), mk(dev, tensor.BF16, nil, m, k)
		dw, db := mk(dev, tensor.F32, dwv, n, k), mk(dev, tensor.BF16, make([]float32, n), n)
		steps := []ops.Matmul{
			{A: x, B: w, D: y, TransB: true, Bias: b},
			{A: dy, B: w, D: dx},
			{A: dy, B: x, D: dw, TransA: true, Accumulate: true},
		}
		for _, mm := range steps {
			if err := e.Matmul(mm); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.ColumnSum(db, dy, false); err != nil {
			t.Fatal(err)
		}
		var out [][]float32
		for _, o := range []*tensor.Tensor{y, dx, dw, db} {
			v, err := o.ReadFloat32()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		return out
	}
	want := run(he, host)
	got := run(cudaEngine(t, d, ops.PrecTF32), d)
	for i, name := range []string{"y", "dx", "dw (accumulated)", "db"} {
		if e := opstest.TermsErr(opstest.F64(got[i]), opstest.F64(want[i]), nil); !(e <= 1e-2) {
			t.Errorf("%s: relative error %.3g > 1e-2", name, e)
		}
	}
	b, err := os.ReadFile(filepath.Join(cache, "gemm-algos.json"))
	if err != nil {
		t.Fatalf("no tuning table: %v", err)
	}
	var table map[string]int
	if err := json.Unmarshal(b, &table); err != nil || len(table) < 3 {
		t.Fatalf("tuning table %s (%v): want the three products", b, err)
	}
	t.Logf("%d tuned specs", len(table))
	again := run(cudaEngine(t, d, ops.PrecTF32), d)
	for i := range got {
		for j := range got[i] {
			if got[i][j] != again[i][j] {
				t.Fatalf("output %d element %d: %v, then %v from the stored choice", i, j, got[i][j], again[i][j])
			}
		}
	}
}
