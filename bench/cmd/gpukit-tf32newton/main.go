// Command gpukit-tf32newton emulates, on the CPU, the coupled Newton
// iteration of libgpu/ops (RootNewton: Guo & Higham 2006 with Anil et
// al. 2020's scaling) with TF32 products — every GEMM operand rounded to
// TF32's 10 mantissa bits (to nearest), products accumulated in f32, as
// tensor cores do — and with f32 products, on Shampoo's first statistics
// (A = GᵀG/k of a Gaussian k×n block: rank-deficient for k < n) at
// several relative ridges, and prints per case the root's relative error
// against the float64 eigendecomposition, the error of G·X (what Shampoo's
// update sees), and the residual δ = ‖X⁴(A + rI) − I‖_F computed with f32
// products, with ops.ResidualFloor and ops.ResidualAccept for it.
//
// It is the evidence behind ops.NewtonTF32MinRelEps: TF32 rounding of M
// pushes the smallest eigenvalues of the iteration's M negative at small
// ridges, and the iteration diverges. (In plain f32 the same emulation
// reproduced an H100's Newton error and residual at order 512; an H100's
// TF32 did better than this emulation at ridge 1e-4 there, so treat the
// TF32 rows as a pessimistic model, and bench/roots.sh's forced-TF32 rows
// as the measurement.)
//
//	gpukit-tf32newton [-n 45,64,128,256] [-k 0.5] [-releps 1e-6,1e-4,2e-3] [-seed 1]
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/ops/opstest"
)

// tf32 rounds x to TF32 (10 mantissa bits, to nearest, ties away).
func tf32(x float32) float32 {
	b := math.Float32bits(x)
	return math.Float32frombits((b + 0x1000) &^ 0x1fff)
}

// mul is the n×n product a·b in f32, operands rounded to TF32 when round.
func mul(a, b []float32, n int, round bool) []float32 {
	ar, br := a, b
	if round {
		ar, br = make([]float32, len(a)), make([]float32, len(b))
		for i := range a {
			ar[i], br[i] = tf32(a[i]), tf32(b[i])
		}
	}
	c := make([]float32, n*n)
	for i := 0; i < n; i++ {
		for k := 0; k < n; k++ {
			av := ar[i*n+k]
			for j := 0; j < n; j++ {
				c[i*n+j] += av * br[k*n+j]
			}
		}
	}
	return c
}

// pow4 is t⁴ by two squarings (as ops.matPow).
func pow4(t []float32, n int, round bool) []float32 {
	t2 := mul(t, t, n, round)
	return mul(t2, t2, n, round)
}

// newton runs iters iterations for (A + rI)^(−1/4) with z = 5/(2‖A + rI‖_F).
func newton(a []float64, n int, r float64, iters int, round bool) []float32 {
	const p = 4
	var sq, tr float64
	for i, v := range a {
		sq += v * v
		if i/n == i%n {
			tr += v
		}
	}
	z := float64(p+1) / (2 * math.Sqrt(sq+2*r*tr+float64(n)*r*r))
	m, x := make([]float32, n*n), make([]float32, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			v := a[i*n+j]
			if i == j {
				v += r
				x[i*n+j] = float32(math.Pow(z, 1.0/p))
			}
			m[i*n+j] = float32(z * v)
		}
	}
	for k := 0; k < iters; k++ {
		t := make([]float32, n*n)
		for i := range t {
			v := -m[i]
			if i/n == i%n {
				v += p + 1
			}
			t[i] = v / p
		}
		x = mul(x, t, n, round)
		m = mul(pow4(t, n, round), m, n, round)
	}
	xs := make([]float32, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			xs[i*n+j] = 0.5 * (x[i*n+j] + x[j*n+i])
		}
	}
	return xs
}

// residual is ‖X⁴(A + rI) − I‖_F with f32 products (as ops computes it).
func residual(x []float32, a []float64, n int, r float64) float64 {
	af := make([]float32, len(a))
	for i := range a {
		af[i] = float32(a[i])
	}
	xp := pow4(x, n, false)
	y := mul(xp, af, n, false)
	var s float64
	for i := range y {
		v := float64(y[i]) + r*float64(xp[i])
		if i/n == i%n {
			v--
		}
		s += v * v
	}
	return math.Sqrt(s)
}

func list(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func main() {
	ns := flag.String("n", "45,64,128,256", "orders of the statistics")
	kf := flag.Float64("k", 0.5, "rows of G as a fraction of n (< 1: rank-deficient statistics)")
	rel := flag.String("releps", "1e-6,1e-4,5e-4,1e-3,2e-3", "ridges relative to ‖A‖_F")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()
	orders, err1 := list(*ns)
	ridges, err2 := list(*rel)
	if err1 != nil || err2 != nil || *kf <= 0 {
		fmt.Fprintln(os.Stderr, "gpukit-tf32newton: bad -n, -k or -releps")
		os.Exit(2)
	}
	r := rand.New(rand.NewPCG(*seed, 2))
	fmt.Println("k×n block    releps   products  iters  root err   G·X err    δ (f32)    floor      accepted below")
	for _, nf := range orders {
		n := int(nf)
		k := max(1, int(*kf*float64(n)))
		g := make([]float64, k*n)
		for i := range g {
			g[i] = r.NormFloat64()
		}
		a := opstest.RefMatmul(g, g, n, n, k, true, false)
		var sq float64
		for i := range a {
			a[i] = float64(float32(a[i] / float64(k)))
			sq += a[i] * a[i]
		}
		for _, re := range ridges {
			rr := re * math.Sqrt(sq)
			ref := opstest.RefInverseRoot(a, n, 4, rr)
			it := ops.NewtonIters(4, re, n)
			for _, round := range []bool{false, true} {
				x := newton(a, n, rr, it, round)
				xd := opstest.F64(x)
				gx := opstest.RefMatmul(g, xd, k, n, n, false, false)
				gref := opstest.RefMatmul(g, ref, k, n, n, false, false)
				name := map[bool]string{false: "f32", true: "tf32"}[round]
				fmt.Printf("%4d×%-4d  %8.0e  %-8s  %5d  %-9.3g  %-9.3g  %-9.3g  %-9.3g  %.3g\n", k, n, re, name, it,
					opstest.TermsErr(xd, ref, nil), opstest.TermsErr(gx, gref, nil), residual(x, a, n, rr),
					ops.ResidualFloor(n, rr, math.Sqrt(sq)), ops.ResidualAccept(n, rr, math.Sqrt(sq)))
			}
		}
	}
}
