package cuda_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"unsafe"

	"gpukit/libgpu/cuda"
	"gpukit/libgpu/cuda/cudatest"
)

// TestSolverWithoutLibrary: with no cuSOLVER to load, every call returns an
// error naming the library (wrapping ErrNoLibrary); none panics. Runs on
// every machine, in a child process whose libraries are hidden.
func TestSolverWithoutLibrary(t *testing.T) {
	if os.Getenv(envChild) != "hide" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSolverWithoutLibrary$", "-test.v")
		cmd.Env = append(os.Environ(), envChild+"=hide", cuda.EnvCUDAPath+"="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestSolverWithoutLibrary")) {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	check := func(name string, err error) {
		t.Helper()
		if !errors.Is(err, cuda.ErrNoLibrary) || !strings.Contains(err.Error(), "libcusolver") {
			t.Errorf("%s: %v, want ErrNoLibrary naming libcusolver", name, err)
		}
	}
	_, err := cuda.SolverCreate()
	check("SolverCreate", err)
	_, err = cuda.SolverVersion()
	check("SolverVersion", err)
}

func TestSolverStatusNames(t *testing.T) {
	if got := cuda.SolverStatus(6).Error(); got != "CUSOLVER_STATUS_EXECUTION_FAILED (6)" {
		t.Errorf("status 6: %q", got)
	}
	if got := cuda.SolverStatus(99).Error(); got != "cusolverStatus_t(99)" {
		t.Errorf("status 99: %q", got)
	}
	err := error(&cuda.CallError{Func: "cusolverDnSsyevd", Err: cuda.SolverStatusInvalidValue})
	if !errors.Is(err, cuda.SolverStatusInvalidValue) {
		t.Errorf("errors.Is through CallError: %v", err)
	}
}

// TestSyevd decomposes a symmetric matrix with known eigenvalues (Q·diag·Qᵀ
// for a random orthogonal Q) in single and double precision and checks the
// eigenvalues, the residual ‖A·v − λ·v‖ of each eigenvector, and info = 0.
func TestSyevd(t *testing.T) {
	cudatest.RequireGPU(t)
	v, err := cuda.SolverVersion()
	must(t, err)
	t.Logf("cuSOLVER %d", v)
	h, err := cuda.SolverCreate()
	must(t, err)
	defer h.Destroy()
	st, err := cuda.StreamCreate(true)
	must(t, err)
	defer st.Destroy()
	const n = 37
	r := newRand(t)
	// A = Q diag(λ) Qᵀ with Q from Gram–Schmidt of random columns.
	q := make([]float64, n*n)
	for i := range q {
		q[i] = r.NormFloat64()
	}
	for j := 0; j < n; j++ {
		for k := 0; k < j; k++ {
			var d float64
			for i := 0; i < n; i++ {
				d += q[i*n+j] * q[i*n+k]
			}
			for i := 0; i < n; i++ {
				q[i*n+j] -= d * q[i*n+k]
			}
		}
		var s float64
		for i := 0; i < n; i++ {
			s += q[i*n+j] * q[i*n+j]
		}
		for i := 0; i < n; i++ {
			q[i*n+j] /= math.Sqrt(s)
		}
	}
	lam := make([]float64, n)
	for i := range lam {
		lam[i] = float64(i+1) / 4
	}
	a := make([]float64, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			for k := 0; k < n; k++ {
				a[i*n+j] += q[i*n+k] * lam[k] * q[j*n+k]
			}
		}
	}
	for _, c := range []struct {
		name string
		dt   cuda.DataType
		tol  float64
	}{{"f32", cuda.R32F, 1e-4}, {"f64", cuda.R64F, 1e-10}} {
		t.Run(c.name, func(t *testing.T) {
			cudatest.RequireGPU(t)
			size := 4
			if c.dt == cuda.R64F {
				size = 8
			}
			host := make([]byte, n*n*size)
			for i, x := range a {
				putF(host, i, size, x)
			}
			da, err := cuda.MemAlloc(int64(len(host)))
			must(t, err)
			defer cuda.MemFree(da)
			must(t, cuda.MemcpyHtoD(da, ptr(host), int64(len(host))))
			dw, err := cuda.MemAlloc(int64(n * size))
			must(t, err)
			defer cuda.MemFree(dw)
			info, err := cuda.MemAlloc(4)
			must(t, err)
			defer cuda.MemFree(info)
			lwork, err := h.SyevdBufferSize(c.dt, n, n, da, dw)
			must(t, err)
			work, err := cuda.MemAlloc(int64(max(lwork, 1) * size))
			must(t, err)
			defer cuda.MemFree(work)
			must(t, cuda.CtxSynchronize())
			must(t, h.Syevd(st, c.dt, n, n, da, dw, work, lwork, info))
			must(t, st.Synchronize())
			must(t, cuda.MemcpyDtoH(ptr(host), da, int64(len(host))))
			wb := make([]byte, n*size)
			must(t, cuda.MemcpyDtoH(ptr(wb), dw, int64(len(wb))))
			ib := make([]byte, 4)
			must(t, cuda.MemcpyDtoH(ptr(ib), info, 4))
			if ib[0]|ib[1]|ib[2]|ib[3] != 0 {
				t.Fatalf("info = %v", ib)
			}
			got := make([]float64, n)
			for i := range got {
				got[i] = getF(wb, i, size)
			}
			if !sort.Float64sAreSorted(got) {
				t.Errorf("eigenvalues not ascending: %v", got)
			}
			for i := range got {
				if math.Abs(got[i]-lam[i]) > c.tol*lam[n-1] {
					t.Errorf("λ[%d] = %v, want %v", i, got[i], lam[i])
				}
			}
			// Row j (row-major) is the eigenvector of got[j].
			for j := 0; j < n; j++ {
				var res, nv float64
				for i := 0; i < n; i++ {
					var av float64
					for k := 0; k < n; k++ {
						av += a[i*n+k] * getF(host, j*n+k, size)
					}
					d := av - got[j]*getF(host, j*n+i, size)
					res += d * d
					nv += getF(host, j*n+i, size) * getF(host, j*n+i, size)
				}
				if math.Sqrt(res) > 10*c.tol*lam[n-1] || math.Abs(nv-1) > 10*c.tol {
					t.Errorf("eigenvector %d: residual %.3g, norm² %.6f", j, math.Sqrt(res), nv)
				}
			}
		})
	}
}

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

func putF(b []byte, i, size int, x float64) {
	if size == 8 {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
		return
	}
	binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
}

func getF(b []byte, i, size int) float64 {
	if size == 8 {
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
}

// TestSyevBatched decomposes three matrices in one call (A, 2A, 3A with A
// of known eigenvalues) in f32 and f64 and checks every eigenvalue and
// info; it skips when cuSOLVER predates the batched solver (CUDA 12.6).
func TestSyevBatched(t *testing.T) {
	cudatest.RequireGPU(t)
	h, err := cuda.SolverCreate()
	must(t, err)
	defer h.Destroy()
	st, err := cuda.StreamCreate(true)
	must(t, err)
	defer st.Destroy()
	const n, batch = 29, 3
	lam := make([]float64, n)
	for i := range lam {
		lam[i] = float64(i+1) / 8
	}
	// A diagonal matrix in a rotated basis: Householder H = I − 2vvᵀ.
	r := newRand(t)
	v := make([]float64, n)
	var nv float64
	for i := range v {
		v[i] = r.NormFloat64()
		nv += v[i] * v[i]
	}
	a := make([]float64, n*n)
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			for k := 0; k < n; k++ {
				hik := -2 * v[i] * v[k] / nv
				hjk := -2 * v[j] * v[k] / nv
				if i == k {
					hik++
				}
				if j == k {
					hjk++
				}
				a[i*n+j] += hik * lam[k] * hjk
			}
		}
	}
	for _, c := range []struct {
		name string
		dt   cuda.DataType
		size int
		tol  float64
	}{{"f32", cuda.R32F, 4, 1e-4}, {"f64", cuda.R64F, 8, 1e-10}} {
		t.Run(c.name, func(t *testing.T) {
			cudatest.RequireGPU(t)
			host := make([]byte, batch*n*n*c.size)
			for b := 0; b < batch; b++ {
				for i, x := range a {
					putF(host, b*n*n+i, c.size, float64(b+1)*x)
				}
			}
			da, err := cuda.MemAlloc(int64(len(host)))
			must(t, err)
			defer cuda.MemFree(da)
			must(t, cuda.MemcpyHtoD(da, ptr(host), int64(len(host))))
			dw, err := cuda.MemAlloc(int64(batch * n * c.size))
			must(t, err)
			defer cuda.MemFree(dw)
			info, err := cuda.MemAlloc(4 * batch)
			must(t, err)
			defer cuda.MemFree(info)
			ws, err := h.SyevBatchedBufferSize(c.dt, n, n, batch, da, dw)
			if errors.Is(err, cuda.ErrNoSymbol) {
				t.Skipf("no batched eigensolver in this cuSOLVER: %v", err)
			}
			must(t, err)
			work, err := cuda.MemAlloc(max(ws, 1))
			must(t, err)
			defer cuda.MemFree(work)
			must(t, cuda.CtxSynchronize())
			must(t, h.SyevBatched(st, c.dt, n, n, batch, da, dw, work, ws, info))
			must(t, st.Synchronize())
			wb := make([]byte, batch*n*c.size)
			must(t, cuda.MemcpyDtoH(ptr(wb), dw, int64(len(wb))))
			ib := make([]byte, 4*batch)
			must(t, cuda.MemcpyDtoH(ptr(ib), info, int64(len(ib))))
			for _, x := range ib {
				if x != 0 {
					t.Fatalf("info %v", ib)
				}
			}
			for b := 0; b < batch; b++ {
				for i := 0; i < n; i++ {
					got, want := getF(wb, b*n+i, c.size), float64(b+1)*lam[i]
					if math.Abs(got-want) > c.tol*float64(b+1)*lam[n-1] {
						t.Fatalf("matrix %d: λ[%d] = %v, want %v", b, i, got, want)
					}
				}
			}
		})
	}
}

// TestGeqrfOrgqr factorises a random column-major 29×29 matrix with geqrf,
// keeps R, forms Q with orgqr, and checks, in f32 and f64, info = 0, QᵀQ =
// I and Q·R = A.
func TestGeqrfOrgqr(t *testing.T) {
	cudatest.RequireGPU(t)
	h, err := cuda.SolverCreate()
	must(t, err)
	defer h.Destroy()
	st, err := cuda.StreamCreate(true)
	must(t, err)
	defer st.Destroy()
	const n = 29
	r := newRand(t)
	a := make([]float64, n*n) // column-major
	for i := range a {
		a[i] = r.NormFloat64()
	}
	for _, c := range []struct {
		name string
		dt   cuda.DataType
		tol  float64
	}{{"f32", cuda.R32F, 1e-5}, {"f64", cuda.R64F, 1e-12}} {
		t.Run(c.name, func(t *testing.T) {
			cudatest.RequireGPU(t)
			size := 4
			if c.dt == cuda.R64F {
				size = 8
			}
			host := make([]byte, n*n*size)
			for i, x := range a {
				putF(host, i, size, x)
			}
			da, err := cuda.MemAlloc(int64(len(host)))
			must(t, err)
			defer cuda.MemFree(da)
			must(t, cuda.MemcpyHtoD(da, ptr(host), int64(len(host))))
			tau, err := cuda.MemAlloc(int64(n * size))
			must(t, err)
			defer cuda.MemFree(tau)
			info, err := cuda.MemAlloc(8)
			must(t, err)
			defer cuda.MemFree(info)
			l1, err := h.GeqrfBufferSize(c.dt, n, n, n, da)
			must(t, err)
			l2, err := h.OrgqrBufferSize(c.dt, n, n, n, n, da, tau)
			must(t, err)
			lwork := max(l1, l2, 1)
			work, err := cuda.MemAlloc(int64(lwork * size))
			must(t, err)
			defer cuda.MemFree(work)
			must(t, cuda.CtxSynchronize())
			must(t, h.Geqrf(st, c.dt, n, n, n, da, tau, work, lwork, info))
			must(t, st.Synchronize())
			rb := make([]byte, len(host))
			must(t, cuda.MemcpyDtoH(ptr(rb), da, int64(len(rb))))
			must(t, h.Orgqr(st, c.dt, n, n, n, n, da, tau, work, lwork, info.Add(4)))
			must(t, st.Synchronize())
			must(t, cuda.MemcpyDtoH(ptr(host), da, int64(len(host))))
			ib := make([]byte, 8)
			must(t, cuda.MemcpyDtoH(ptr(ib), info, 8))
			for _, x := range ib {
				if x != 0 {
					t.Fatalf("info = %v", ib)
				}
			}
			q := func(i, j int) float64 { return getF(host, j*n+i, size) }
			rr := func(i, j int) float64 {
				if i > j {
					return 0
				}
				return getF(rb, j*n+i, size)
			}
			var orth, res, nrm float64
			for i := 0; i < n; i++ {
				for j := 0; j < n; j++ {
					var d, p float64
					for k := 0; k < n; k++ {
						d += q(k, i) * q(k, j)
						p += q(i, k) * rr(k, j)
					}
					if i == j {
						d--
					}
					orth += d * d
					res += (p - a[j*n+i]) * (p - a[j*n+i])
					nrm += a[j*n+i] * a[j*n+i]
				}
			}
			if math.Sqrt(orth) > 10*c.tol*n || math.Sqrt(res/nrm) > 10*c.tol*n {
				t.Errorf("‖QᵀQ − I‖ = %.3g, ‖QR − A‖/‖A‖ = %.3g", math.Sqrt(orth), math.Sqrt(res/nrm))
			}
		})
	}
}
