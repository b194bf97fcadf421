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

// xentInputs uploads n×v logits of dtype dt drawn from N(0, 2²) and n
// targets (one in ten ignored), returning the stored logits as float64.
func xentInputs(tb testing.TB, a device.Allocator, r *rand.Rand, dt tensor.DType, n, v int) (*tensor.Tensor, []float64, *tensor.Tensor, []int32) {
	tb.Helper()
	x := opstest.Empty(tb, a, dt, n, v)
	xv := opstest.Rand(r, n*v)
	for i := range xv {
		xv[i] *= 4
	}
	if err := x.WriteFloat32(xv); err != nil {
		tb.Fatal(err)
	}
	stored, err := x.ReadFloat32()
	if err != nil {
		tb.Fatal(err)
	}
	tg := make([]int32, n)
	for i := range tg {
		tg[i] = int32(r.IntN(v))
		if r.IntN(10) == 0 {
			tg[i] = -1
		}
	}
	return x, opstest.F64(stored), opstest.UploadI32(tb, a, tg, n), tg
}

// TestCUDACrossEntropyLarge: the GPT shapes (V 65 over 16384 rows, and
// GPT-2's V 50257 over fewer rows so the float64 reference stays quick),
// f32 and bf16: loss and gradient match the reference and are bitwise the
// same on every run (many blocks feed the last-block reduction).
func TestCUDACrossEntropyLarge(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecBF16)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(rand.Uint64(), 13))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, sh := range [][2]int{{16384, 65}, {512, 50257}, {3001, 2053}} {
			n, v := sh[0], sh[1]
			t.Run(fmt.Sprintf("%v/N=%d,V=%d", dt, n, v), func(t *testing.T) {
				x, xv, targets, tg := xentInputs(t, a, r, dt, n, v)
				loss := opstest.Empty(t, a, tensor.F32, 1)
				dl := opstest.Empty(t, a, dt, n, v)
				var first [2][]byte
				for run := 0; run < 3; run++ {
					if err := e.CrossEntropy(loss, dl, x, targets, false); err != nil {
						t.Fatal(err)
					}
					lb, db := syncReadBytes(t, e, loss), syncReadBytes(t, e, dl)
					if run == 0 {
						first = [2][]byte{lb, db}
						continue
					}
					if !bytes.Equal(lb, first[0]) || !bytes.Equal(db, first[1]) {
						t.Fatalf("run %d differs from run 0", run)
					}
				}
				_, mean, grad := opstest.RefCrossEntropy(xv, tg, n, v)
				_, tmean, tgrad := opstest.RefCrossEntropyTerms(xv, tg, n, v)
				opstest.Close(t, "loss", syncReadFloats(t, e, loss), []float64{mean}, []float64{tmean}, 1e-5)
				tol := 1e-5
				if dt == tensor.BF16 {
					tol = 1e-2
				}
				opstest.Close(t, "dlogits", syncReadFloats(t, e, dl), grad, tgrad, tol)
			})
		}
	}
}

// TestCUDACrossEntropyGraphMatchesEager: loss with gradient, accumulated
// gradient and per-row losses, captured once and replayed, give bitwise
// the eager results.
func TestCUDACrossEntropyGraphMatchesEager(t *testing.T) {
	d := gpu(t)
	e := cudaEngine(t, d, ops.PrecBF16)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(rand.Uint64(), 14))
	for _, v := range []int{65, 5003} {
		t.Run(fmt.Sprintf("V=%d", v), func(t *testing.T) {
			const n = 777
			x, _, targets, _ := xentInputs(t, a, r, tensor.BF16, n, v)
			loss := opstest.Empty(t, a, tensor.F32, 1)
			dl := opstest.Empty(t, a, tensor.BF16, n, v)
			rows := opstest.Empty(t, a, tensor.F32, n)
			step := func() error {
				if err := e.CrossEntropy(loss, dl, x, targets, false); err != nil {
					return err
				}
				if err := e.CrossEntropy(loss, dl, x, targets, true); err != nil {
					return err
				}
				return e.CrossEntropyRows(rows, x, targets)
			}
			if err := step(); err != nil {
				t.Fatal(err)
			}
			want := [][]byte{syncReadBytes(t, e, loss), syncReadBytes(t, e, dl), syncReadBytes(t, e, rows)}
			for _, x := range []*tensor.Tensor{loss, dl, rows} {
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
			for i, x := range []*tensor.Tensor{loss, dl, rows} {
				if !bytes.Equal(syncReadBytes(t, e, x), want[i]) {
					t.Fatalf("output %d: graph replay differs from eager", i)
				}
			}
		})
	}
}

// BenchmarkCUDACrossEntropy times the fused loss and gradient (bf16
// logits and dlogits) at nanoGPT's shakespeare-char shape (64×256 rows,
// V 65) and GPT-2's vocabulary (8192 rows, V 50257), and the loss alone
// at the latter. GB/s counts one read of the logits and one write of
// dlogits (the floor; the kernel reads each row twice, the second time
// mostly from L2).
func BenchmarkCUDACrossEntropy(b *testing.B) {
	d := gpu(b)
	e := cudaEngine(b, d, ops.PrecBF16)
	a := device.Local{Dev: d}
	r := rand.New(rand.NewPCG(3, 4))
	for _, sh := range [][2]int{{16384, 65}, {8192, 50257}} {
		n, v := sh[0], sh[1]
		x, _, targets, _ := xentInputs(b, a, r, tensor.BF16, n, v)
		loss := opstest.Empty(b, a, tensor.F32, 1)
		dl := opstest.Empty(b, a, tensor.BF16, n, v)
		bytesNV := int64(n) * int64(v) * 2
		b.Run(fmt.Sprintf("fwd+bwd/N=%d,V=%d,bf16", n, v), func(b *testing.B) {
			benchGraphReplay(b, e, 10, 2*bytesNV, func() error { return e.CrossEntropy(loss, dl, x, targets, false) })
		})
		b.Run(fmt.Sprintf("loss-only/N=%d,V=%d,bf16", n, v), func(b *testing.B) {
			benchGraphReplay(b, e, 10, bytesNV, func() error { return e.CrossEntropy(loss, nil, x, targets, false) })
		})
	}
}
