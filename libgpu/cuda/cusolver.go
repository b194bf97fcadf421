package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// cuSOLVER's dense solvers (cusolverDn, libcusolver.so), loaded at run
// time like cuBLASLt: the symmetric eigendecomposition syevd and the QR
// factorisation geqrf with its orthogonal factor orgqr, in single and
// double precision, on a stream, for the inverse matrix roots and
// eigenbases of second-order optimizers (libgpu/ops/matroot.go, qr.go).

var libSolver = &library{names: []string{"libcusolver.so.12", "libcusolver.so.11", "libcusolver.so"},
	hint: "CUDA toolkit's cuSOLVER not installed?"}

var (
	pSolverCreate    = newProc(libSolver, "cusolverDnCreate")
	pSolverDestroy   = newProc(libSolver, "cusolverDnDestroy")
	pSolverSetStream = newProc(libSolver, "cusolverDnSetStream")
	pSolverVersion   = newProc(libSolver, "cusolverGetVersion")
	pSsyevdBufSize   = newProc(libSolver, "cusolverDnSsyevd_bufferSize")
	pDsyevdBufSize   = newProc(libSolver, "cusolverDnDsyevd_bufferSize")
	pSsyevd          = newProc(libSolver, "cusolverDnSsyevd")
	pDsyevd          = newProc(libSolver, "cusolverDnDsyevd")
	pCreateParams    = newProc(libSolver, "cusolverDnCreateParams")
	pDestroyParams   = newProc(libSolver, "cusolverDnDestroyParams")
	pSyevBatchedSize = newProc(libSolver, "cusolverDnXsyevBatched_bufferSize")
	pSyevBatched     = newProc(libSolver, "cusolverDnXsyevBatched")
	pSgeqrfBufSize   = newProc(libSolver, "cusolverDnSgeqrf_bufferSize")
	pDgeqrfBufSize   = newProc(libSolver, "cusolverDnDgeqrf_bufferSize")
	pSgeqrf          = newProc(libSolver, "cusolverDnSgeqrf")
	pDgeqrf          = newProc(libSolver, "cusolverDnDgeqrf")
	pSorgqrBufSize   = newProc(libSolver, "cusolverDnSorgqr_bufferSize")
	pDorgqrBufSize   = newProc(libSolver, "cusolverDnDorgqr_bufferSize")
	pSorgqr          = newProc(libSolver, "cusolverDnSorgqr")
	pDorgqr          = newProc(libSolver, "cusolverDnDorgqr")
)

// ErrSolverDestroyed: the SolverHandle was destroyed.
var ErrSolverDestroyed = errors.New("cusolver: handle destroyed")

// SolverStatus is cuSOLVER's cusolverStatus_t; it implements error like Result.
type SolverStatus int32

// cuSOLVER statuses that callers test for.
const (
	SolverStatusSuccess      SolverStatus = 0
	SolverStatusInvalidValue SolverStatus = 3
	SolverStatusExecFailed   SolverStatus = 6
)

var solverNames = map[SolverStatus]string{
	0: "CUSOLVER_STATUS_SUCCESS", 1: "CUSOLVER_STATUS_NOT_INITIALIZED", 2: "CUSOLVER_STATUS_ALLOC_FAILED",
	3: "CUSOLVER_STATUS_INVALID_VALUE", 4: "CUSOLVER_STATUS_ARCH_MISMATCH", 5: "CUSOLVER_STATUS_MAPPING_ERROR",
	6: "CUSOLVER_STATUS_EXECUTION_FAILED", 7: "CUSOLVER_STATUS_INTERNAL_ERROR",
	8: "CUSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED", 9: "CUSOLVER_STATUS_NOT_SUPPORTED",
	10: "CUSOLVER_STATUS_ZERO_PIVOT", 11: "CUSOLVER_STATUS_INVALID_LICENSE",
}

// Name returns the enumerator's name, or "" for an unknown code.
func (s SolverStatus) Name() string { return solverNames[s] }

func (s SolverStatus) Error() string { return named(solverNames[s], "cusolverStatus_t", int32(s)) }

// solver calls a cuSOLVER function and turns its cusolverStatus_t into an error.
//
//go:uintptrescapes
func (p *proc) solver(args ...uintptr) error {
	r, err := p.call(args...)
	if err != nil {
		return err
	}
	if st := SolverStatus(int32(r)); st != SolverStatusSuccess {
		return &CallError{Func: p.names[0], Err: st}
	}
	return nil
}

// SolverVersion returns cuSOLVER's version, e.g. 12000 for 12.0.0.
func SolverVersion() (int, error) {
	var v int32
	err := pSolverVersion.solver(uintptr(unsafe.Pointer(&v)))
	return int(v), err
}

// SolverHandle is a cusolverDn handle. Calls on one handle are serialised
// (cuSOLVER handles are not safe for concurrent use); the calling thread
// must have a current context.
type SolverHandle struct {
	mu     sync.Mutex
	h      uintptr
	params uintptr        // cusolverDnParams_t of the 64-bit API, made on first use
	host   unsafe.Pointer // pinned host workspace of SyevBatched (grown)
	hostN  int64
}

// SolverCreate creates a cusolverDn handle (cusolverDnCreate).
func SolverCreate() (*SolverHandle, error) {
	var h uintptr
	if err := pSolverCreate.solver(uintptr(unsafe.Pointer(&h))); err != nil {
		return nil, err
	}
	return &SolverHandle{h: h}, nil
}

// Destroy frees the handle. A second Destroy does nothing.
func (s *SolverHandle) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == 0 {
		return nil
	}
	var errs []error
	if s.params != 0 {
		errs = append(errs, pDestroyParams.solver(s.params))
		s.params = 0
	}
	if s.host != nil {
		errs = append(errs, MemFreeHost(s.host))
		s.host, s.hostN = nil, 0
	}
	errs = append(errs, pSolverDestroy.solver(s.h))
	s.h = 0
	return errors.Join(errs...)
}

// Eigenvalue problem options (cusolverEigMode_t, cublasFillMode_t).
const (
	solverEigModeVector = 1 // CUSOLVER_EIG_MODE_VECTOR
	fillModeLower       = 0 // CUBLAS_FILL_MODE_LOWER
)

func syevdProcs(dt DataType) (size, run *proc, err error) {
	switch dt {
	case R32F:
		return pSsyevdBufSize, pSsyevd, nil
	case R64F:
		return pDsyevdBufSize, pDsyevd, nil
	}
	return nil, nil, fmt.Errorf("%w: syevd of data type %d (want R32F or R64F)", ErrBadArg, dt)
}

// SyevdBufferSize is the workspace, in elements of dt (R32F or R64F), that
// Syevd needs for an n×n matrix with leading dimension lda
// (cusolverDn<t>syevd_bufferSize with eigenvectors wanted, lower triangle).
// a and w are the matrix and eigenvalue buffers Syevd will get.
func (s *SolverHandle) SyevdBufferSize(dt DataType, n, lda int, a, w DevicePtr) (int, error) {
	if n <= 0 || lda < n {
		return 0, badArg("syevd of n = %d, lda = %d", n, lda)
	}
	size, _, err := syevdProcs(dt)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == 0 {
		return 0, ErrSolverDestroyed
	}
	var lwork int32
	err = size.solver(s.h, solverEigModeVector, fillModeLower, uintptr(n), uintptr(a), uintptr(lda), uintptr(w),
		uintptr(unsafe.Pointer(&lwork)))
	return int(lwork), err
}

// Syevd queues, on stream st, the eigendecomposition of the symmetric n×n
// matrix at a (column-major, leading dimension lda, only the lower
// triangle read; row-major symmetric data is the same matrix) in precision
// dt (R32F or R64F): eigenvalues in ascending order into w (n elements),
// eigenvectors over a (column j of the column-major result is the
// eigenvector of w[j]; read row-major, row j is). work holds lwork
// elements (SyevdBufferSize); info (one int32 on the device) receives 0 on
// success, i > 0 when i off-diagonal elements of an intermediate form did
// not converge, −i when argument i was bad. Nothing is read back: the
// call does not wait for the GPU.
func (s *SolverHandle) Syevd(st Stream, dt DataType, n, lda int, a, w, work DevicePtr, lwork int, info DevicePtr) error {
	if n <= 0 || lda < n || lwork < 0 {
		return badArg("syevd of n = %d, lda = %d, lwork = %d", n, lda, lwork)
	}
	_, run, err := syevdProcs(dt)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == 0 {
		return ErrSolverDestroyed
	}
	if err := pSolverSetStream.solver(s.h, uintptr(st)); err != nil {
		return err
	}
	return run.solver(s.h, solverEigModeVector, fillModeLower, uintptr(n), uintptr(a), uintptr(lda), uintptr(w),
		uintptr(work), uintptr(lwork), uintptr(info))
}

// paramsLocked returns the handle's cusolverDnParams_t, made on first use.
func (s *SolverHandle) paramsLocked() (uintptr, error) {
	if s.params != 0 {
		return s.params, nil
	}
	var p uintptr
	if err := pCreateParams.solver(uintptr(unsafe.Pointer(&p))); err != nil {
		return 0, err
	}
	s.params = p
	return p, nil
}

// SyevBatchedBufferSize is the device workspace in bytes that SyevBatched
// needs for batch n×n matrices of dt (R32F or R64F) with leading dimension
// lda (cusolverDnXsyevBatched_bufferSize, eigenvectors wanted, lower
// triangle). The host workspace the call may also need is the handle's.
// Errors wrap ErrNoSymbol when cuSOLVER predates the batched solver
// (CUDA 12.6).
func (s *SolverHandle) SyevBatchedBufferSize(dt DataType, n, lda, batch int, a, w DevicePtr) (int64, error) {
	if n <= 0 || lda < n || batch <= 0 {
		return 0, badArg("syevBatched of n = %d, lda = %d, batch = %d", n, lda, batch)
	}
	if _, _, err := syevdProcs(dt); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == 0 {
		return 0, ErrSolverDestroyed
	}
	p, err := s.paramsLocked()
	if err != nil {
		return 0, err
	}
	var dev, host uint64
	err = pSyevBatchedSize.solver(s.h, p, solverEigModeVector, fillModeLower, uintptr(n), uintptr(dt), uintptr(a),
		uintptr(lda), uintptr(dt), uintptr(w), uintptr(dt), uintptr(unsafe.Pointer(&dev)), uintptr(unsafe.Pointer(&host)),
		uintptr(batch))
	return int64(dev), err
}

// SyevBatched queues, on stream st, the eigendecomposition of batch
// symmetric n×n matrices stored one after another at a (column-major,
// leading dimension lda, lower triangle read; lda·n elements apart) in
// precision dt (cusolverDnXsyevBatched): eigenvalues ascending into w (n
// per matrix), eigenvectors over a, and per matrix 0 (converged) or a
// positive count into info (batch int32 on the device). work holds
// workBytes (SyevBatchedBufferSize); a host workspace, when the library
// asks for one, is pinned memory the handle keeps. n·lda·batch must not
// exceed 2³¹−1 (the library's limit).
func (s *SolverHandle) SyevBatched(st Stream, dt DataType, n, lda, batch int, a, w, work DevicePtr, workBytes int64, info DevicePtr) error {
	if n <= 0 || lda < n || batch <= 0 || workBytes < 0 || int64(n)*int64(lda)*int64(batch) > 1<<31-1 {
		return badArg("syevBatched of n = %d, lda = %d, batch = %d, %d workspace bytes", n, lda, batch, workBytes)
	}
	if _, _, err := syevdProcs(dt); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == 0 {
		return ErrSolverDestroyed
	}
	p, err := s.paramsLocked()
	if err != nil {
		return err
	}
	var dev, host uint64
	if err := pSyevBatchedSize.solver(s.h, p, solverEigModeVector, fillModeLower, uintptr(n), uintptr(dt), uintptr(a),
		uintptr(lda), uintptr(dt), uintptr(w), uintptr(dt), uintptr(unsafe.Pointer(&dev)), uintptr(unsafe.Pointer(&host)),
		uintptr(batch)); err != nil {
		return err
	}
	if int64(dev) > workBytes {
		return badArg("syevBatched needs %d workspace bytes, got %d", dev, workBytes)
	}
	if int64(host) > s.hostN {
		if s.host != nil {
			if err := MemFreeHost(s.host); err != nil {
				return err
			}
			s.host, s.hostN = nil, 0
		}
		if s.host, err = MemHostAlloc(int64(host)); err != nil {
			return err
		}
		s.hostN = int64(host)
	}
	if err := pSolverSetStream.solver(s.h, uintptr(st)); err != nil {
		return err
	}
	return pSyevBatched.solver(s.h, p, solverEigModeVector, fillModeLower, uintptr(n), uintptr(dt), uintptr(a),
		uintptr(lda), uintptr(dt), uintptr(w), uintptr(dt), uintptr(work), uintptr(workBytes), uintptr(s.host),
		uintptr(host), uintptr(info), uintptr(batch))
}

// qrProcs are the geqrf and orgqr functions of dt.
func qrProcs(dt DataType) (geqrfSize, geqrf, orgqrSize, orgqr *proc, err error) {
	switch dt {
	case R32F:
		return pSgeqrfBufSize, pSgeqrf, pSorgqrBufSize, pSorgqr, nil
	case R64F:
		return pDgeqrfBufSize, pDgeqrf, pDorgqrBufSize, pDorgqr, nil
	}
	return nil, nil, nil, nil, fmt.Errorf("%w: QR of data type %d (want R32F or R64F)", ErrBadArg, dt)
}

// GeqrfBufferSize is the workspace, in elements of dt (R32F or R64F), that
// Geqrf needs for an m×n matrix at a with leading dimension lda
// (cusolverDn<t>geqrf_bufferSize(handle, m, n, A, lda, &lwork)).
func (s *SolverHandle) GeqrfBufferSize(dt DataType, m, n, lda int, a DevicePtr) (int, error) {
	if m <= 0 || n <= 0 || lda < m {
		return 0, badArg("geqrf of m = %d, n = %d, lda = %d", m, n, lda)
	}
	size, _, _, _, err := qrProcs(dt)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == 0 {
		return 0, ErrSolverDestroyed
	}
	var lwork int32
	err = size.solver(s.h, uintptr(m), uintptr(n), uintptr(a), uintptr(lda), uintptr(unsafe.Pointer(&lwork)))
	return int(lwork), err
}

// Geqrf queues, on stream st, the QR factorisation A = Q·R of the m×n
// matrix at a (column-major, leading dimension lda) in precision dt
// (cusolverDn<t>geqrf(handle, m, n, A, lda, TAU, Workspace, Lwork,
// devInfo)): R over A's upper triangle, the Householder vectors below it
// and their scalars in tau (min(m, n) elements); work holds lwork
// elements (GeqrfBufferSize); info (one int32 on the device) receives 0,
// or −i when argument i was bad. Nothing is read back.
func (s *SolverHandle) Geqrf(st Stream, dt DataType, m, n, lda int, a, tau, work DevicePtr, lwork int, info DevicePtr) error {
	if m <= 0 || n <= 0 || lda < m || lwork < 0 {
		return badArg("geqrf of m = %d, n = %d, lda = %d, lwork = %d", m, n, lda, lwork)
	}
	_, run, _, _, err := qrProcs(dt)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == 0 {
		return ErrSolverDestroyed
	}
	if err := pSolverSetStream.solver(s.h, uintptr(st)); err != nil {
		return err
	}
	return run.solver(s.h, uintptr(m), uintptr(n), uintptr(a), uintptr(lda), uintptr(tau), uintptr(work),
		uintptr(lwork), uintptr(info))
}

// OrgqrBufferSize is the workspace, in elements of dt, that Orgqr needs
// (cusolverDn<t>orgqr_bufferSize(handle, m, n, k, A, lda, tau, &lwork)).
func (s *SolverHandle) OrgqrBufferSize(dt DataType, m, n, k, lda int, a, tau DevicePtr) (int, error) {
	if m <= 0 || n <= 0 || n > m || k < 0 || k > n || lda < m {
		return 0, badArg("orgqr of m = %d, n = %d, k = %d, lda = %d", m, n, k, lda)
	}
	_, _, size, _, err := qrProcs(dt)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == 0 {
		return 0, ErrSolverDestroyed
	}
	var lwork int32
	err = size.solver(s.h, uintptr(m), uintptr(n), uintptr(k), uintptr(a), uintptr(lda), uintptr(tau),
		uintptr(unsafe.Pointer(&lwork)))
	return int(lwork), err
}

// Orgqr queues, on stream st, the formation of the m×n matrix Q with
// orthonormal columns from k Householder reflectors left by Geqrf at a
// and tau, over a (cusolverDn<t>orgqr(handle, m, n, k, A, lda, tau, work,
// lwork, devInfo)); work holds lwork elements (OrgqrBufferSize); info as
// Geqrf's. Nothing is read back.
func (s *SolverHandle) Orgqr(st Stream, dt DataType, m, n, k, lda int, a, tau, work DevicePtr, lwork int, info DevicePtr) error {
	if m <= 0 || n <= 0 || n > m || k < 0 || k > n || lda < m || lwork < 0 {
		return badArg("orgqr of m = %d, n = %d, k = %d, lda = %d, lwork = %d", m, n, k, lda, lwork)
	}
	_, _, _, run, err := qrProcs(dt)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == 0 {
		return ErrSolverDestroyed
	}
	if err := pSolverSetStream.solver(s.h, uintptr(st)); err != nil {
		return err
	}
	return run.solver(s.h, uintptr(m), uintptr(n), uintptr(k), uintptr(a), uintptr(lda), uintptr(tau), uintptr(work),
		uintptr(lwork), uintptr(info))
}
