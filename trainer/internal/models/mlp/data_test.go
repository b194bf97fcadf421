package mlp

import (
	"math/rand/v2"
	"slices"
	"testing"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/data"
	"gpukit/libgpu/tensor"
)

// TestFillMatchesData: the table-driven batch fill writes bitwise what
// data.Set.Fill writes.
func TestFillMatchesData(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 2))
	const n, rows, cols = 50, 5, 7
	set := &data.Set{Images: make([]uint8, n*rows*cols), Labels: make([]uint8, n), N: n, Rows: rows, Cols: cols}
	for i := range set.Images {
		set.Images[i] = uint8(r.IntN(256))
	}
	for i := range set.Images[:256] {
		set.Images[i] = uint8(i) // every pixel value at least once
	}
	for i := range set.Labels {
		set.Labels[i] = uint8(r.IntN(10))
	}
	idx := r.Perm(n)[:20]
	x1, x2 := make([]float32, 20*rows*cols), make([]float32, 20*rows*cols)
	y1, y2 := make([]int32, 20), make([]int32, 20)
	if err := set.Fill(x1, y1, idx); err != nil {
		t.Fatal(err)
	}
	if err := fill(set, x2, y2, idx); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tensor.AsBytes(x1), tensor.AsBytes(x2)) || !slices.Equal(y1, y2) {
		t.Fatal("fill differs from data.Set.Fill")
	}
	if err := fill(set, x2[:10], y2, idx); err == nil {
		t.Fatal("fill into a short x succeeded")
	}
	if err := fill(set, x2, y2, []int{n}); err == nil {
		t.Fatal("fill of an example out of range succeeded")
	}
}

// TestWriteBatches: the file holds, step by step, the batches Run trains on
// (data.Order per epoch, last partial batch dropped).
func TestWriteBatches(t *testing.T) {
	cfg := Default()
	cfg.Batch, cfg.Epochs, cfg.Seed, cfg.Limit = 7, 3, rand.Uint64(), 40
	p := t.TempDir() + "/b.safetensors"
	if err := WriteBatches(p, cfg, 100); err != nil {
		t.Fatal(err)
	}
	f, err := ckpt.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	info, raw, err := f.Bytes(BatchesTensor)
	if err != nil {
		t.Fatal(err)
	}
	nb := 40 / 7
	if !slices.Equal(info.Shape, []int{3 * nb, 7}) || info.DType != tensor.I32 || f.Metadata["steps"] != "15" {
		t.Fatalf("shape %v dtype %v metadata %v", info.Shape, info.DType, f.Metadata)
	}
	got := tensor.BytesAs[int32](raw)
	for e := range 3 {
		order := data.Order(40, cfg.Seed, e)
		for b := range nb {
			for k, i := range data.Batch(order, 7, b) {
				if got[(e*nb+b)*7+k] != int32(i) {
					t.Fatalf("epoch %d batch %d row %d: %d, want %d", e, b, k, got[(e*nb+b)*7+k], i)
				}
			}
		}
	}
	cfg.Limit = 5
	if err := WriteBatches(p, cfg, 100); err == nil {
		t.Fatal("no batch: accepted")
	}
}
