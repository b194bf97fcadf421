package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

var (
	pLtCreate          = newProc(libBLASLt, "cublasLtCreate")
	pLtDestroy         = newProc(libBLASLt, "cublasLtDestroy")
	pLtGetVersion      = newProc(libBLASLt, "cublasLtGetVersion")
	pLtDescCreate      = newProc(libBLASLt, "cublasLtMatmulDescCreate")
	pLtDescDestroy     = newProc(libBLASLt, "cublasLtMatmulDescDestroy")
	pLtDescSetAttr     = newProc(libBLASLt, "cublasLtMatmulDescSetAttribute")
	pLtLayoutCreate    = newProc(libBLASLt, "cublasLtMatrixLayoutCreate")
	pLtLayoutDestroy   = newProc(libBLASLt, "cublasLtMatrixLayoutDestroy")
	pLtLayoutSetAttr   = newProc(libBLASLt, "cublasLtMatrixLayoutSetAttribute")
	pLtPrefCreate      = newProc(libBLASLt, "cublasLtMatmulPreferenceCreate")
	pLtPrefDestroy     = newProc(libBLASLt, "cublasLtMatmulPreferenceDestroy")
	pLtPrefSetAttr     = newProc(libBLASLt, "cublasLtMatmulPreferenceSetAttribute")
	pLtAlgoGetHeuristc = newProc(libBLASLt, "cublasLtMatmulAlgoGetHeuristic")
	pLtMatmul          = newProc(libBLASLt, "cublasLtMatmul")
)

// Errors of the cuBLASLt layer.
var (
	// ErrBadGemm: a GemmSpec or GemmArgs is inconsistent.
	ErrBadGemm = errors.New("cublaslt: bad GEMM spec")
	// ErrNoAlgorithm: the heuristic found no algorithm for the spec.
	ErrNoAlgorithm = errors.New("cublaslt: no algorithm for this GEMM")
	// ErrHandleDestroyed: the LtHandle was destroyed.
	ErrHandleDestroyed = errors.New("cublaslt: handle destroyed")
)

// DataType is a cudaDataType_t (library_types.h).
type DataType int32

// Data types.
const (
	R32F  DataType = 0  // CUDA_R_32F
	R64F  DataType = 1  // CUDA_R_64F
	R16F  DataType = 2  // CUDA_R_16F
	R8I   DataType = 3  // CUDA_R_8I
	R32I  DataType = 10 // CUDA_R_32I
	R16BF DataType = 14 // CUDA_R_16BF
	R8F   DataType = 28 // CUDA_R_8F_E4M3
	R8F52 DataType = 29 // CUDA_R_8F_E5M2
)

// ComputeType is a cublasComputeType_t (cublas_api.h).
type ComputeType int32

// Compute types.
const (
	Compute16F         ComputeType = 64
	Compute32F         ComputeType = 68
	Compute32FPedantic ComputeType = 69
	Compute64F         ComputeType = 70
	Compute32FFast16F  ComputeType = 74
	Compute32FFast16BF ComputeType = 75
	Compute32FFastTF32 ComputeType = 77
)

// Epilogue is a cublasLtEpilogue_t (cublasLt.h): what is applied to the
// product before it is stored. Bit 4 adds a bias vector (BiasPointer, one
// value per row of D); bit 128 reads or writes the aux matrix.
type Epilogue int32

// Epilogues.
const (
	EpilogueDefault     Epilogue = 1
	EpilogueReLU        Epilogue = 2
	EpilogueBias        Epilogue = 4
	EpilogueReLUBias    Epilogue = 6
	EpilogueGELU        Epilogue = 32
	EpilogueGELUBias    Epilogue = 36
	EpilogueReLUAux     Epilogue = 130 // also stores the ReLU bit-mask in Aux
	EpilogueReLUAuxBias Epilogue = 134
	EpilogueDReLU       Epilogue = 136 // multiplies by the ReLU mask read from Aux
	EpilogueDReLUBGrad  Epilogue = 152 // and writes the bias gradient to Bias
	EpilogueGELUAux     Epilogue = 160 // also stores the GELU input in Aux
	EpilogueGELUAuxBias Epilogue = 164
	EpilogueDGELU       Epilogue = 192
	EpilogueDGELUBGrad  Epilogue = 208
	EpilogueBGradA      Epilogue = 256 // bias gradient from A (rows of D) into Bias
	EpilogueBGradB      Epilogue = 512 // bias gradient from B (columns of D) into Bias
)

func (e Epilogue) usesBias() bool {
	return e&4 != 0 || e == EpilogueDReLUBGrad || e == EpilogueDGELUBGrad || e == EpilogueBGradA || e == EpilogueBGradB
}

func (e Epilogue) usesAux() bool { return e&128 != 0 }

// Attribute numbers (cublasLt.h).
const (
	ltDescTransA        = 3
	ltDescTransB        = 4
	ltDescEpilogue      = 7
	ltDescBiasPointer   = 8
	ltDescAuxPointer    = 11
	ltDescAuxLD         = 12
	ltDescAuxDataType   = 22
	ltDescBiasDataType  = 26
	ltLayoutBatchCount  = 5
	ltLayoutBatchStride = 6
	ltPrefMaxWorkspace  = 1
	ltPrefMinAlignA     = 5
	ltPrefMinAlignB     = 6
	ltPrefMinAlignC     = 7
	ltPrefMinAlignD     = 8
)

// GemmSpec describes one matmul shape, column-major (cuBLAS convention):
//
//	D[M,N] = epilogue(alpha·op(A)·op(B) + beta·C)
//
// op(A) is M×K (A is stored K×M when TransA), op(B) is K×N (N×K when
// TransB); C and D are M×N. Leading dimensions are in elements (0 = the
// number of rows as stored). Strides are in elements, for Batch > 1.
//
// Row-major data is the transpose of column-major data, so a row-major
// layer Y[M,N] = relu(X[M,K]·W[N,K]ᵀ + b) is the column-major product with
// A = W (stored K×N, ld K, TransA = true), B = X (stored K×M, ld K,
// TransB = false), D = Y (N×M, ld N) and Epilogue = EpilogueReLUBias with
// b's N values in Bias: GemmSpec{TransA: true, M: N, N: M, K: K, LDA: K,
// LDB: K, LDC: N, LDD: N, ...} (DESIGN.md, verified on an H200).
//
// Data types: f32 data with Compute32F or Compute32FFastTF32 (TF32 tensor
// cores); bf16 data (R16BF) with Compute32F. The scale type (alpha, beta) is
// always f32. GemmSpec is comparable and is the cache key of LtHandle.
type GemmSpec struct {
	TransA, TransB     bool
	M, N, K            int
	LDA, LDB, LDC, LDD int
	Batch              int   // 1 (or 0) when not batched
	StrideA, StrideB   int64 // elements between batch items
	StrideC, StrideD   int64
	AType, BType       DataType
	CType, DType       DataType
	Compute            ComputeType // 0 = Compute32F
	Epilogue           Epilogue    // 0 = EpilogueDefault
	// BiasType 0 keeps cuBLASLt's default, D's type (bf16 data ⇒ bf16 bias;
	// an f32 bias with bf16 data makes the heuristic answer INVALID_VALUE).
	// R32F is 0, so an f32 bias is only had with f32 D.
	BiasType DataType
	AuxLD    int      // leading dimension of Aux in elements; 0 = M (ReLU bit-mask: M rounded up to 128)
	AuxType  DataType // 0 = the default
}

// GemmArgs are the per-call operands: device pointers, scalars, workspace.
// C may be 0 when Beta is 0 (D is passed in its place). Bias and Aux are
// needed by the epilogues that use them.
type GemmArgs struct {
	A, B, C, D, Bias, Aux DevicePtr
	Alpha, Beta           float32
	Workspace             DevicePtr
	WorkspaceSize         int64
}

// LtAlgo is one algorithm the heuristic proposed (cublasLtMatmulAlgo_t) with
// the workspace it needs in bytes and its estimated waves per SM.
type LtAlgo struct {
	raw           [8]uint64
	WorkspaceSize int64
	Waves         float32
}

// ltHeuristicResult mirrors cublasLtMatmulHeuristicResult_t (96 bytes):
// algo uint64[8] at 0, workspaceSize at 64, state (cublasStatus_t) at 72,
// wavesCount (float) at 76, int reserved[4] at 80.
type ltHeuristicResult struct {
	Algo          [8]uint64
	WorkspaceSize uint64
	State         int32
	Waves         float32
	Reserved      [4]int32
}

type planKey struct {
	spec  GemmSpec
	ws    int64
	align uint32
}

// ltPlan holds the descriptors of one spec; mu serialises the per-call
// attributes (bias, aux pointers) with the matmul that reads them.
type ltPlan struct {
	mu              sync.Mutex
	desc            uintptr
	a, b, c, d      uintptr
	algo            [8]uint64
	ws              int64
	alpha, beta     float32
	biasPtr, auxPtr uint64
}

// LtHandle is a cuBLASLt handle with a cache of descriptors and chosen
// algorithms per (spec, workspace size, pointer alignment). It is safe for
// concurrent use; the calling thread must have a current context.
type LtHandle struct {
	mu     sync.Mutex
	h      uintptr
	plans  map[planKey]*ltPlan
	chosen map[GemmSpec]LtAlgo
}

// LtVersion returns cuBLASLt's version, e.g. 130100 for 13.1.0.
func LtVersion() (int, error) {
	r, err := pLtGetVersion.call()
	return int(r), err
}

// LtCreate creates a cuBLASLt handle.
func LtCreate() (*LtHandle, error) {
	var h uintptr
	if err := pLtCreate.blas(uintptr(unsafe.Pointer(&h))); err != nil {
		return nil, err
	}
	return &LtHandle{h: h, plans: map[planKey]*ltPlan{}, chosen: map[GemmSpec]LtAlgo{}}, nil
}

// Destroy frees the cached descriptors and the handle.
func (h *LtHandle) Destroy() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h == 0 {
		return nil
	}
	var first error
	for k, p := range h.plans {
		if err := p.destroy(); err != nil && first == nil {
			first = err
		}
		delete(h.plans, k)
	}
	err := pLtDestroy.blas(h.h)
	h.h = 0
	if first != nil {
		return first
	}
	return err
}

func (p *ltPlan) destroy() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for _, l := range []uintptr{p.a, p.b, p.c, p.d} {
		if l != 0 {
			keep(pLtLayoutDestroy.blas(l))
		}
	}
	if p.desc != 0 {
		keep(pLtDescDestroy.blas(p.desc))
	}
	return first
}

func (s GemmSpec) normalized() (GemmSpec, error) {
	if s.M <= 0 || s.N <= 0 || s.K <= 0 {
		return s, fmt.Errorf("%w: M, N, K = %d, %d, %d", ErrBadGemm, s.M, s.N, s.K)
	}
	ar, _ := s.aDims()
	br, _ := s.bDims()
	def := func(ld *int, rows int, name string) error {
		if *ld == 0 {
			*ld = rows
		}
		if *ld < rows {
			return fmt.Errorf("%w: %s = %d < %d rows", ErrBadGemm, name, *ld, rows)
		}
		return nil
	}
	for _, e := range []error{def(&s.LDA, ar, "LDA"), def(&s.LDB, br, "LDB"), def(&s.LDC, s.M, "LDC"), def(&s.LDD, s.M, "LDD")} {
		if e != nil {
			return s, e
		}
	}
	if s.Batch == 0 {
		s.Batch = 1
	}
	if s.Batch < 0 {
		return s, fmt.Errorf("%w: Batch = %d", ErrBadGemm, s.Batch)
	}
	if s.Compute == 0 {
		s.Compute = Compute32F
	}
	if s.Epilogue == 0 {
		s.Epilogue = EpilogueDefault
	}
	if s.Epilogue.usesAux() && s.AuxLD == 0 {
		s.AuxLD = s.M
		if s.Epilogue == EpilogueReLUAux || s.Epilogue == EpilogueReLUAuxBias || s.Epilogue == EpilogueDReLU || s.Epilogue == EpilogueDReLUBGrad {
			s.AuxLD = (s.M + 127) / 128 * 128
		}
	}
	return s, nil
}

// aDims returns A's stored rows and columns.
func (s GemmSpec) aDims() (rows, cols int) {
	if s.TransA {
		return s.K, s.M
	}
	return s.M, s.K
}

func (s GemmSpec) bDims() (rows, cols int) {
	if s.TransB {
		return s.N, s.K
	}
	return s.K, s.N
}

func boolOp(t bool) int32 {
	if t {
		return 1 // CUBLAS_OP_T
	}
	return 0 // CUBLAS_OP_N
}

func setDesc(desc uintptr, attr int, v unsafe.Pointer, size uintptr) error {
	return pLtDescSetAttr.blas(desc, uintptr(attr), uintptr(v), size)
}

func newLayout(t DataType, rows, cols, ld, batch int, stride int64) (uintptr, error) {
	var l uintptr
	if err := pLtLayoutCreate.blas(uintptr(unsafe.Pointer(&l)), uintptr(t), uintptr(rows), uintptr(cols), uintptr(ld)); err != nil {
		return 0, err
	}
	if batch > 1 {
		b := int32(batch)
		if err := pLtLayoutSetAttr.blas(l, ltLayoutBatchCount, uintptr(unsafe.Pointer(&b)), 4); err != nil {
			_ = pLtLayoutDestroy.blas(l)
			return 0, err
		}
		if err := pLtLayoutSetAttr.blas(l, ltLayoutBatchStride, uintptr(unsafe.Pointer(&stride)), 8); err != nil {
			_ = pLtLayoutDestroy.blas(l)
			return 0, err
		}
	}
	return l, nil
}

// build creates the descriptors of a normalized spec.
func buildPlan(s GemmSpec) (*ltPlan, error) {
	p := &ltPlan{}
	fail := func(err error) (*ltPlan, error) {
		_ = p.destroy()
		return nil, err
	}
	if err := pLtDescCreate.blas(uintptr(unsafe.Pointer(&p.desc)), uintptr(s.Compute), uintptr(R32F)); err != nil {
		return fail(err)
	}
	ta, tb, epi := boolOp(s.TransA), boolOp(s.TransB), uint32(s.Epilogue)
	if err := setDesc(p.desc, ltDescTransA, unsafe.Pointer(&ta), 4); err != nil {
		return fail(err)
	}
	if err := setDesc(p.desc, ltDescTransB, unsafe.Pointer(&tb), 4); err != nil {
		return fail(err)
	}
	if err := setDesc(p.desc, ltDescEpilogue, unsafe.Pointer(&epi), 4); err != nil {
		return fail(err)
	}
	if s.BiasType != 0 {
		bt := int32(s.BiasType)
		if err := setDesc(p.desc, ltDescBiasDataType, unsafe.Pointer(&bt), 4); err != nil {
			return fail(err)
		}
	}
	if s.Epilogue.usesAux() {
		ld := int64(s.AuxLD)
		if err := setDesc(p.desc, ltDescAuxLD, unsafe.Pointer(&ld), 8); err != nil {
			return fail(err)
		}
		if s.AuxType != 0 {
			at := int32(s.AuxType)
			if err := setDesc(p.desc, ltDescAuxDataType, unsafe.Pointer(&at), 4); err != nil {
				return fail(err)
			}
		}
	}
	var err error
	ar, ac := s.aDims()
	br, bc := s.bDims()
	if p.a, err = newLayout(s.AType, ar, ac, s.LDA, s.Batch, s.StrideA); err != nil {
		return fail(err)
	}
	if p.b, err = newLayout(s.BType, br, bc, s.LDB, s.Batch, s.StrideB); err != nil {
		return fail(err)
	}
	if p.c, err = newLayout(s.CType, s.M, s.N, s.LDC, s.Batch, s.StrideC); err != nil {
		return fail(err)
	}
	if p.d, err = newLayout(s.DType, s.M, s.N, s.LDD, s.Batch, s.StrideD); err != nil {
		return fail(err)
	}
	return p, nil
}

// heuristic asks for up to n algorithms and returns those whose state is
// success, best first.
func (h *LtHandle) heuristic(p *ltPlan, ws int64, align uint32, n int) ([]LtAlgo, error) {
	var pref uintptr
	if err := pLtPrefCreate.blas(uintptr(unsafe.Pointer(&pref))); err != nil {
		return nil, err
	}
	defer func() { _ = pLtPrefDestroy.blas(pref) }()
	w := uint64(ws)
	if err := pLtPrefSetAttr.blas(pref, ltPrefMaxWorkspace, uintptr(unsafe.Pointer(&w)), 8); err != nil {
		return nil, err
	}
	for _, a := range []int{ltPrefMinAlignA, ltPrefMinAlignB, ltPrefMinAlignC, ltPrefMinAlignD} {
		if err := pLtPrefSetAttr.blas(pref, uintptr(a), uintptr(unsafe.Pointer(&align)), 4); err != nil {
			return nil, err
		}
	}
	res := make([]ltHeuristicResult, n)
	var got int32
	if err := pLtAlgoGetHeuristc.blas(h.h, p.desc, p.a, p.b, p.c, p.d, pref, uintptr(n),
		uintptr(unsafe.Pointer(&res[0])), uintptr(unsafe.Pointer(&got))); err != nil {
		return nil, err
	}
	var out []LtAlgo
	for _, r := range res[:min(int(got), n)] {
		if r.State == int32(BLASStatusSuccess) {
			out = append(out, LtAlgo{raw: r.Algo, WorkspaceSize: int64(r.WorkspaceSize), Waves: r.Waves})
		}
	}
	return out, nil
}

// alignOf returns the largest power of two ≤ 256 that divides every non-zero
// pointer.
func alignOf(ptrs ...DevicePtr) uint32 {
	a := uint32(256)
	for _, p := range ptrs {
		for p != 0 && uint64(p)%uint64(a) != 0 {
			a /= 2
		}
	}
	return a
}

// candidateWorkspace is the workspace limit in bytes Candidates assumes.
const candidateWorkspace = 32 << 20

// plan returns the cached plan of key, building it (and choosing its
// algorithm) on first use.
func (h *LtHandle) plan(key planKey) (*ltPlan, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h == 0 {
		return nil, ErrHandleDestroyed
	}
	if p, ok := h.plans[key]; ok {
		return p, nil
	}
	p, err := buildPlan(key.spec)
	if err != nil {
		return nil, err
	}
	algos, err := h.heuristic(p, key.ws, key.align, 8)
	if err == nil && len(algos) == 0 {
		err = fmt.Errorf("%w (%+v)", ErrNoAlgorithm, key.spec)
	}
	if err != nil {
		_ = p.destroy()
		return nil, err
	}
	p.algo, p.ws = algos[0].raw, algos[0].WorkspaceSize
	h.plans[key] = p
	return p, nil
}

// Candidates returns up to n algorithms (n ≤ 64) the heuristic proposes for
// spec, best first, assuming 256-byte aligned pointers and a workspace of up
// to 32 MiB, so that a benchmark can time each with MatmulAlgo and install
// the fastest with SetAlgo.
func (h *LtHandle) Candidates(spec GemmSpec, n int) ([]LtAlgo, error) {
	s, err := spec.normalized()
	if err != nil {
		return nil, err
	}
	if n <= 0 || n > 64 {
		return nil, fmt.Errorf("%w: %d candidates", ErrBadGemm, n)
	}
	p, err := h.plan(planKey{spec: s, ws: candidateWorkspace, align: 256})
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h == 0 {
		return nil, ErrHandleDestroyed
	}
	return h.heuristic(p, candidateWorkspace, 256, n)
}

// SetAlgo makes Matmul use algo for spec whenever the call's workspace is
// large enough for it.
func (h *LtHandle) SetAlgo(spec GemmSpec, algo LtAlgo) error {
	s, err := spec.normalized()
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.chosen[s] = algo
	return nil
}

// Matmul queues D = epilogue(alpha·op(A)·op(B) + beta·C) on s (see
// GemmSpec). The descriptors and the heuristic's first successful algorithm
// are built once per (spec, workspace size, pointer alignment) and cached.
// Errors: ErrBadGemm for an inconsistent spec or missing operand,
// ErrNoAlgorithm, or the cuBLASLt status.
func (h *LtHandle) Matmul(spec GemmSpec, args GemmArgs, s Stream) error {
	return h.matmul(spec, args, s, nil)
}

// MatmulAlgo is Matmul with an algorithm from Candidates.
func (h *LtHandle) MatmulAlgo(spec GemmSpec, args GemmArgs, algo LtAlgo, s Stream) error {
	return h.matmul(spec, args, s, &algo)
}

func (h *LtHandle) matmul(spec GemmSpec, args GemmArgs, s Stream, algo *LtAlgo) error {
	sp, err := spec.normalized()
	if err != nil {
		return err
	}
	if args.A == 0 || args.B == 0 || args.D == 0 {
		return fmt.Errorf("%w: nil A, B or D", ErrBadGemm)
	}
	if args.WorkspaceSize < 0 || (args.WorkspaceSize > 0 && args.Workspace == 0) {
		return fmt.Errorf("%w: workspace %d bytes at %#x", ErrBadGemm, args.WorkspaceSize, args.Workspace)
	}
	if sp.Epilogue.usesBias() && args.Bias == 0 {
		return fmt.Errorf("%w: epilogue %d needs Bias", ErrBadGemm, sp.Epilogue)
	}
	if sp.Epilogue.usesAux() && args.Aux == 0 {
		return fmt.Errorf("%w: epilogue %d needs Aux", ErrBadGemm, sp.Epilogue)
	}
	c := args.C
	if c == 0 {
		if args.Beta != 0 {
			return fmt.Errorf("%w: nil C with beta %g", ErrBadGemm, args.Beta)
		}
		c = args.D
	}
	key := planKey{spec: sp, ws: args.WorkspaceSize, align: alignOf(args.A, args.B, c, args.D)}
	p, err := h.plan(key)
	if err != nil {
		return err
	}
	if algo == nil {
		h.mu.Lock()
		if a, ok := h.chosen[sp]; ok && a.WorkspaceSize <= args.WorkspaceSize {
			algo = &a
		}
		h.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if sp.Epilogue.usesBias() && p.biasPtr != uint64(args.Bias) {
		p.biasPtr = uint64(args.Bias)
		if err := setDesc(p.desc, ltDescBiasPointer, unsafe.Pointer(&p.biasPtr), 8); err != nil {
			return err
		}
	}
	if sp.Epilogue.usesAux() && p.auxPtr != uint64(args.Aux) {
		p.auxPtr = uint64(args.Aux)
		if err := setDesc(p.desc, ltDescAuxPointer, unsafe.Pointer(&p.auxPtr), 8); err != nil {
			return err
		}
	}
	p.alpha, p.beta = args.Alpha, args.Beta
	alg := &p.algo
	if algo != nil {
		if algo.WorkspaceSize > args.WorkspaceSize {
			return fmt.Errorf("%w: algorithm needs %d bytes of workspace, have %d", ErrBadGemm, algo.WorkspaceSize, args.WorkspaceSize)
		}
		alg = &algo.raw
	}
	return pLtMatmul.blas(h.h, p.desc, uintptr(unsafe.Pointer(&p.alpha)),
		uintptr(args.A), p.a, uintptr(args.B), p.b, uintptr(unsafe.Pointer(&p.beta)),
		uintptr(c), p.c, uintptr(args.D), p.d, uintptr(unsafe.Pointer(alg)),
		uintptr(args.Workspace), uintptr(args.WorkspaceSize), uintptr(s))
}
