package ops_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gpukit/libgpu/cuda/cudatest"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
	"gpukit/libgpu/tensor"
)

// TestCUDAQRLarge: at the orders SOAP's blocks have (a batch of 3 of order
// 512, and one of 1024), cuSOLVER's QR (f32, and f64) against the host's
// float64 QR (gonum) and the float64 Gram–Schmidt reference, on
// well-conditioned matrices (2·I + G/(2√n)): Q agrees with both to 1e-4,
// Q·Qᵀ = I to 1e-4, and A·Qᵀ is lower triangular with a non-negative
// diagonal (the sign convention that makes the host and CUDA agree).
// Statuses 0.
func TestCUDAQRLarge(t *testing.T) {
	d := gpu(t)
	a := device.Local{Dev: d}
	hd := device.NewHost()
	host, err := ops.NewEngine(hd, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hostA := device.Local{Dev: hd}
	for _, sz := range []struct{ batch, n int }{{3, 512}, {1, 1024}} {
		r := rand.New(rand.NewPCG(uint64(sz.n), 7))
		av := make([]float32, sz.batch*sz.n*sz.n)
		for i := range av {
			av[i] = float32(r.NormFloat64() / (2 * math.Sqrt(float64(sz.n))))
		}
		for b := 0; b < sz.batch; b++ {
			for i := 0; i < sz.n; i++ {
				av[(b*sz.n+i)*sz.n+i] += 2
			}
		}
		hq := opstest.Upload(t, hostA, av, sz.batch, sz.n, sz.n)
		if err := host.QR(ops.QR{A: hq, Q: hq}); err != nil {
			t.Fatal(err)
		}
		hv, _ := hq.ReadFloat32()
		for _, f64 := range []bool{false, true} {
			t.Run(fmt.Sprintf("n=%d/f64=%v", sz.n, f64), func(t *testing.T) {
				cudatest.RequireGPU(t)
				e := cudaEngine(t, d, ops.PrecF32)
				at := opstest.Upload(t, a, av, sz.batch, sz.n, sz.n)
				q := opstest.Empty(t, a, tensor.F32, sz.batch, sz.n, sz.n)
				st := opstest.Empty(t, a, tensor.I32, sz.batch)
				if err := e.QR(ops.QR{A: at, Q: q, F64: f64, Status: st}); err != nil {
					t.Fatal(err)
				}
				if err := e.Sync(); err != nil {
					t.Fatal(err)
				}
				qv, _ := q.ReadFloat32()
				sb, _ := st.Read()
				n, nn := sz.n, sz.n*sz.n
				for b := 0; b < sz.batch; b++ {
					if s := tensor.BytesAs[int32](sb)[b]; s != 0 {
						t.Errorf("n=%d f64=%v matrix %d: status %d", n, f64, b, s)
					}
					qb, ab := opstest.F64(qv[b*nn:(b+1)*nn]), opstest.F64(av[b*nn:(b+1)*nn])
					if e := opstest.TermsErr(qb, opstest.F64(hv[b*nn:(b+1)*nn]), nil); !(e < 1e-4) {
						t.Errorf("n=%d f64=%v matrix %d: CUDA vs host QR: relative error %.3g", n, f64, b, e)
					}
					if b == 0 {
						ref, _ := opstest.RefQRRows(ab, n)
						if e := opstest.TermsErr(qb, ref, nil); !(e < 1e-4) {
							t.Errorf("n=%d f64=%v: CUDA vs Gram–Schmidt: relative error %.3g", n, f64, e)
						}
					}
					orth, upper, anorm, minDiag := opstest.QRRowsResiduals(ab, qb, n)
					t.Logf("n=%d f64=%v matrix %d: ‖QQᵀ−I‖ %.3g, upper part of A·Qᵀ %.3g of ‖A‖, min diag %.3g",
						n, f64, b, orth, upper/anorm, minDiag)
					if orth > 1e-4*math.Sqrt(float64(n)) || upper/anorm > 1e-5 || minDiag < 0 {
						t.Errorf("n=%d f64=%v matrix %d: not an orthonormalisation of A's rows with diag ≥ 0", n, f64, b)
					}
				}
			})
		}
	}
}

// TestCUDASOAPBasisLarge: SOAP's power-iteration refresh on the GPU at
// order 256 (a batch of 2; statistics U·diag(1..n)·Uᵀ/n, random bases)
// against the host's: the same permutation and bases within 1e-3, at f32
// and TF32 engine precision (the product S·q runs in full f32 at both).
func TestCUDASOAPBasisLarge(t *testing.T) {
	d := gpu(t)
	a := device.Local{Dev: d}
	hd := device.NewHost()
	host, err := ops.NewEngine(hd, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hostA := device.Local{Dev: hd}
	const batch, n = 2, 256
	r := rand.New(rand.NewPCG(3, 4))
	orth := func() []float32 {
		g := make([]float64, n*n)
		for i := range g {
			g[i] = r.NormFloat64()
		}
		q, _ := opstest.RefQRRows(g, n)
		return opstest.F32(q)
	}
	var lv, qv []float32
	for b := 0; b < batch; b++ {
		u := orth()
		l := make([]float64, n*n)
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				for k := 0; k < n; k++ {
					l[i*n+j] += float64(u[k*n+i]) * float64(k+1) / n * float64(u[k*n+j])
				}
			}
		}
		lv = append(lv, opstest.F32(l)...)
		qv = append(qv, orth()...)
	}
	hl, hq := opstest.Upload(t, hostA, lv, batch, n, n), opstest.Upload(t, hostA, qv, batch, n, n)
	hp := opstest.Empty(t, hostA, tensor.I32, batch, n)
	if err := host.SOAPBasis(ops.SOAPBasis{L: hl, Q: hq, Perm: hp}); err != nil {
		t.Fatal(err)
	}
	want, _ := hq.ReadFloat32()
	wp, _ := hp.Read()
	for _, prec := range precs[:2] {
		t.Run(prec.name, func(t *testing.T) {
			cudatest.RequireGPU(t)
			e := cudaEngine(t, d, prec.prec)
			l, q := opstest.Upload(t, a, lv, batch, n, n), opstest.Upload(t, a, qv, batch, n, n)
			p := opstest.Empty(t, a, tensor.I32, batch, n)
			st := opstest.Empty(t, a, tensor.I32, batch)
			if err := e.SOAPBasis(ops.SOAPBasis{L: l, Q: q, Perm: p, Status: st}); err != nil {
				t.Fatal(err)
			}
			if err := e.Sync(); err != nil {
				t.Fatal(err)
			}
			got, _ := q.ReadFloat32()
			gp, _ := p.Read()
			sb, _ := st.Read()
			for b, s := range tensor.BytesAs[int32](sb) {
				if s != 0 {
					t.Errorf("matrix %d: status %d", b, s)
				}
			}
			diff := 0
			for i, x := range tensor.BytesAs[int32](gp) {
				if x != tensor.BytesAs[int32](wp)[i] {
					diff++
				}
			}
			if diff > 0 {
				t.Errorf("%d permutation entries differ from the host's", diff)
			}
			if e := opstest.TermsErr(opstest.F64(got), opstest.F64(want), nil); !(e < 1e-3) {
				t.Errorf("CUDA vs host basis: relative error %.3g", e)
			}
		})
	}
}

// qrLanesInput is a batch of well-conditioned matrices (2·I + G/(2√n)),
// seeded.
func qrLanesInput(t testing.TB, batch, n int, seed uint64) []float32 {
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 11))
	av := make([]float32, batch*n*n)
	for i := range av {
		av[i] = float32(r.NormFloat64() / (2 * math.Sqrt(float64(n))))
	}
	for b := 0; b < batch; b++ {
		for i := 0; i < n; i++ {
			av[(b*n+i)*n+i] += 2
		}
	}
	return av
}

// TestCUDAQRLanes: QR spreads its matrices over streams (exec's Lanes);
// the factors do not depend on how: one lane, eight lanes, eight lanes
// captured from the side stream inside a graph and replayed into a
// poisoned output, and the same from the main stream, all give bitwise
// the same Q (each matrix is factorised by the same calls, only on
// another stream), and it agrees with the host's float64 QR to 1e-4.
func TestCUDAQRLanes(t *testing.T) {
	d := gpu(t)
	a := device.Local{Dev: d}
	const batch, n = 11, 384
	av := qrLanesInput(t, batch, n, 5)
	hd := device.NewHost()
	host, err := ops.NewEngine(hd, ops.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hq := opstest.Upload(t, device.Local{Dev: hd}, av, batch, n, n)
	if err := host.QR(ops.QR{A: hq, Q: hq}); err != nil {
		t.Fatal(err)
	}
	want, _ := hq.ReadFloat32()
	e := cudaEngine(t, d, ops.PrecF32)
	at := opstest.Upload(t, a, av, batch, n, n)
	run := func(lanes int, side, capture bool) []float32 {
		t.Helper()
		defer ops.SetQRLanes(lanes)()
		q := opstest.Upload(t, a, make([]float32, batch*n*n), batch, n, n)
		if err := e.Fill(q, math.NaN()); err != nil {
			t.Fatal(err)
		}
		op := func() error {
			if side {
				if err := e.Side(func() error { return e.QR(ops.QR{A: at, Q: q}) }); err != nil {
					return err
				}
				return e.Join()
			}
			return e.QR(ops.QR{A: at, Q: q})
		}
		if capture {
			if err := op(); err != nil { // the eager run makes the lanes' scratch
				t.Fatal(err)
			}
			g, err := e.Capture(op)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if err := e.Fill(q, math.NaN()); err != nil {
				t.Fatal(err)
			}
			if err := g.Launch(); err != nil {
				t.Fatal(err)
			}
		} else if err := op(); err != nil {
			t.Fatal(err)
		}
		if err := e.Sync(); err != nil {
			t.Fatal(err)
		}
		v, _ := q.ReadFloat32()
		return v
	}
	one := run(1, false, false)
	if e := opstest.TermsErr(opstest.F64(one), opstest.F64(want), nil); !(e < 1e-4) {
		t.Errorf("CUDA (1 lane) vs host QR: relative error %.3g", e)
	}
	for _, c := range []struct {
		name          string
		lanes         int
		side, capture bool
	}{{"8 lanes", 8, false, false}, {"8 lanes, side stream, graph", 8, true, true}, {"8 lanes, main stream, graph", 8, false, true}, {"3 lanes", 3, false, false}} {
		got := run(c.lanes, c.side, c.capture)
		diff := 0
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(one[i]) {
				diff++
			}
		}
		if diff > 0 {
			t.Errorf("%s: %d of %d elements differ from one lane's", c.name, diff, len(got))
		}
	}
}

// BenchmarkCUDAQR times QR on a batch of 32 matrices at SOAP's block
// orders with the matrices spread over 1 to 16 streams: ms per batch,
// eager, synchronised per batch.
func BenchmarkCUDAQR(b *testing.B) {
	d := gpu(b)
	a := device.Local{Dev: d}
	e := cudaEngine(b, d, ops.PrecF32)
	const batch = 32
	for _, n := range []int{384, 768} {
		at := opstest.Upload(b, a, qrLanesInput(b, batch, n, uint64(n)), batch, n, n)
		q := opstest.Empty(b, a, tensor.F32, batch, n, n)
		for _, lanes := range []int{1, 4, 8, 16} {
			b.Run(fmt.Sprintf("n=%d/lanes=%d", n, lanes), func(b *testing.B) {
				defer ops.SetQRLanes(lanes)()
				for i := 0; i < 2; i++ { // warm: handles, scratch
					if err := e.QR(ops.QR{A: at, Q: q}); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.Sync(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := e.QR(ops.QR{A: at, Q: q}); err != nil {
						b.Fatal(err)
					}
					if err := e.Sync(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/batch")
			})
		}
	}
}
