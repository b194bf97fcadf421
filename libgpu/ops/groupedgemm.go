package ops

// The groupedgemm family: one matrix product per group of contiguous rows,
// the groups' row offsets read from device memory — the experts' GEMMs of
// a Mixture-of-Experts layer, whose token counts the routing computes on
// the device, so a training step needs no host synchronisation and is
// captured as one CUDA graph (megablocks' grouped GEMM, Gale et al. 2023,
// "MegaBlocks: Efficient Sparse Training with Mixture-of-Experts";
// PyTorch's torch._grouped_mm, CUTLASS's grouped GEMM on sm_90). Forward
// and both backward products, the bias gradient, and Graph.GroupedLinear.
// Kernels: libgpu/kernels/groupedgemm.cu (wgmma for bf16 on sm_90a, CUDA
// cores otherwise); reference and checks: opstest/groupedgemm.go.

import (
	"fmt"
	"strconv"

	"gonum.org/v1/gonum/blas"

	"gpukit/libgpu/exec"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// GroupedMaxGroups bounds the groups (experts) of one grouped product.
const GroupedMaxGroups = 1024 // GG_MAXE

// ggShape is a validated grouped product: E groups over T rows, W [E, N, K].
type ggShape struct{ e, t, n, k int }

// checkGrouped validates x [T, K], w [E, N, K] (one dtype, f32 or bf16,
// contiguous) and offsets (i32 [E+1], contiguous).
func (e *Engine) checkGrouped(op string, x, w, offsets *tensor.Tensor) (ggShape, error) {
	var s ggShape
	if err := e.checkView(op+" x", x, true, floatTypes); err != nil {
		return s, err
	}
	if err := e.checkView(op+" w", w, true, []tensor.DType{x.DType}); err != nil {
		return s, err
	}
	if x.Rank() != 2 || w.Rank() != 3 || w.Dim(2) != x.Dim(1) {
		return s, fmt.Errorf("%w: %s x %v, w %v (want [T, K] and [E, N, K])", tensor.ErrShape, op, x.Shape, w.Shape)
	}
	s = ggShape{e: w.Dim(0), t: x.Dim(0), n: w.Dim(1), k: w.Dim(2)}
	if s.e < 1 || s.e > GroupedMaxGroups {
		return s, fmt.Errorf("%w: %s of %d groups (want 1 to %d)", tensor.ErrShape, op, s.e, GroupedMaxGroups)
	}
	if err := e.checkView(op+" offsets", offsets, true, []tensor.DType{tensor.I32}, s.e+1); err != nil {
		return s, err
	}
	if int64(s.t)*int64(max(s.n, s.k)) > 1<<40 || int64(s.e)*int64(s.n)*int64(s.k) > 1<<40 {
		return s, fmt.Errorf("%w: %s x %v, w %v too large", tensor.ErrShape, op, x.Shape, w.Shape)
	}
	return s, checkDims(s.t, s.n, s.k)
}

// outTypes are the dtypes a grouped product may write: f32, or the
// operands' dtype.
func outTypes(dt tensor.DType) []tensor.DType { return []tensor.DType{tensor.F32, dt} }

// GroupedMatmul computes, for each group g of rows [off[g], off[g+1]) (off
// = offsets, read on the device),
//
//	y[r, n] = Σ_k x[r, k]·w[g, n, k] + b[g, n]      (or added to y with acc)
//
// for x [T, K] and w [E, N, K] (PyTorch's nn.Linear weight per expert),
// both f32 or both bf16; y [T, N], f32 or the operands' dtype; b [E, N] of
// the operands' dtype, or nil; offsets i32 [E+1], non-decreasing from
// off[0] ≥ 0 to off[E] ≤ T, E ≤ GroupedMaxGroups. All contiguous. Rows
// outside every group are not written. Products accumulate in f32: in
// full f32 for f32 operands (also under PrecTF32: the CUDA-core kernel
// computes f32 products), exactly for bf16 operands, on Hopper tensor
// cores (wgmma) when K and N are multiples of 8 and the tensors 16-byte
// aligned. The host checks the offsets (ErrConfig); CUDA reads them in the
// kernel and clamps them into [0, T], non-decreasing, without checking
// (the routing ops produce valid ones). Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or ErrConfig.
func (e *Engine) GroupedMatmul(y, x, w, b, offsets *tensor.Tensor, acc bool) error {
	s, err := e.checkGrouped("grouped matmul", x, w, offsets)
	if err != nil {
		return err
	}
	if err := e.checkView("grouped matmul y", y, true, outTypes(x.DType), s.t, s.n); err != nil {
		return err
	}
	if b != nil {
		if err := e.checkView("grouped matmul b", b, true, []tensor.DType{x.DType}, s.e, s.n); err != nil {
			return err
		}
	}
	if s.t == 0 || s.n == 0 {
		return nil
	}
	return e.dispatch(func(h *hostImpl) error { return h.groupedFwd(y, x, w, b, offsets, s, acc) },
		func(c *cudaImpl) error {
			a := launch.GgArgs{A: devPtr(x), B: devPtr(w), C: devPtr(y), Offsets: devPtr(offsets), Lda: int64(s.k), Ldb: int64(s.k),
				Ldc: int64(s.n), Sb: int64(s.n) * int64(s.k), E: int32(s.e), Rows: int32(s.t), N: int32(s.n), K: int32(s.k)}
			if b != nil {
				a.Bias = devPtr(b)
			}
			if acc {
				a.Acc = 1
			}
			return c.grouped(ggFwd, &a, x.DType, y.DType, s.k%8 == 0 && s.n%8 == 0, x, w, y, b)
		})
}

// GroupedMatmulBackward computes the gradients of GroupedMatmul from dy
// [T, N] (of the operands' dtype), for each group g of rows R_g:
//
//	dx[r, k] = Σ_n dy[r, n]·w[g, n, k]        (r in R_g)
//	dw[g, n, k] = Σ_{r in R_g} dy[r, n]·x[r, k]
//	db[g, n] = Σ_{r in R_g} dy[r, n]
//
// dx [T, K], dw [E, N, K] and db [E, N], each f32 or the operands' dtype
// (an f32 master's gradient under bf16 autocast), or nil when not wanted;
// acc[0..2] add to them instead of overwriting. An empty group's dw and db
// are zero. Rows of dx outside every group are not written. Precision and
// errors as GroupedMatmul.
func (e *Engine) GroupedMatmulBackward(dx, dw, db, dy, x, w, offsets *tensor.Tensor, acc [3]bool) error {
	s, err := e.checkGrouped("grouped matmul backward", x, w, offsets)
	if err != nil {
		return err
	}
	if err := e.checkView("grouped matmul backward dy", dy, true, []tensor.DType{x.DType}, s.t, s.n); err != nil {
		return err
	}
	for _, c := range []struct {
		what  string
		t     *tensor.Tensor
		shape []int
	}{{"dx", dx, []int{s.t, s.k}}, {"dw", dw, []int{s.e, s.n, s.k}}, {"db", db, []int{s.e, s.n}}} {
		if c.t == nil {
			continue
		}
		if err := e.checkView("grouped matmul backward "+c.what, c.t, true, outTypes(x.DType), c.shape...); err != nil {
			return err
		}
	}
	return e.dispatch(func(h *hostImpl) error { return h.groupedBwd(dx, dw, db, dy, x, w, offsets, s, acc) },
		func(c *cudaImpl) error {
			vec := s.k%8 == 0 && s.n%8 == 0
			if dx != nil && s.t > 0 && s.k > 0 {
				a := launch.GgArgs{A: devPtr(dy), B: devPtr(w), C: devPtr(dx), Offsets: devPtr(offsets), Lda: int64(s.n), Ldb: int64(s.k),
					Ldc: int64(s.k), Sb: int64(s.n) * int64(s.k), E: int32(s.e), Rows: int32(s.t), N: int32(s.k), K: int32(s.n)}
				if acc[0] {
					a.Acc = 1
				}
				if err := c.grouped(ggDX, &a, x.DType, dx.DType, vec, dy, w, dx); err != nil {
					return err
				}
			}
			if dw != nil && s.k > 0 && s.n > 0 {
				a := launch.GgArgs{A: devPtr(dy), B: devPtr(x), C: devPtr(dw), Offsets: devPtr(offsets), Lda: int64(s.n), Ldb: int64(s.k),
					Ldc: int64(s.k), Sc: int64(s.n) * int64(s.k), E: int32(s.e), Rows: int32(s.t), M: int32(s.n), N: int32(s.k)}
				if acc[1] {
					a.Acc = 1
				}
				if err := c.grouped(ggDW, &a, x.DType, dw.DType, vec, dy, x, dw); err != nil {
					return err
				}
			}
			if db != nil && s.n > 0 {
				return launch.GgColsum(c, dtName(x.DType)+dtSuffix(db.DType),
					[3]uint32{uint32((s.n + 31) / 32), uint32(s.e), 1}, [3]uint32{32, 8, 1}, 0,
					devPtr(db), devPtr(dy), devPtr(offsets), int32(s.t), int32(s.n), int64(s.n), launch.Bool(acc[2]))
			}
			return nil
		})
}

// ---- host ----

// hostOffsets reads and checks a grouped product's offsets.
func hostOffsets(offsets *tensor.Tensor, t int) ([]int32, error) {
	off, err := offsets.I32()
	if err != nil {
		return nil, fmt.Errorf("ops: host backend: %w", err)
	}
	if off[0] < 0 || int(off[len(off)-1]) > t {
		return nil, fmt.Errorf("%w: grouped matmul offsets %d..%d outside [0, %d]", ErrConfig, off[0], off[len(off)-1], t)
	}
	for g := 1; g < len(off); g++ {
		if off[g] < off[g-1] {
			return nil, fmt.Errorf("%w: grouped matmul offsets decrease at group %d (%d < %d)", ErrConfig, g, off[g], off[g-1])
		}
	}
	return off, nil
}

// hostRowsOut returns row-major f32 space holding t's current values (so
// rows no group covers keep them) and the commit that stores it back.
func hostRowsOut(t *tensor.Tensor) ([]float32, func() error, error) {
	if t.DType == tensor.F32 && t.Contiguous() {
		s, err := t.F32()
		if err != nil {
			return nil, nil, fmt.Errorf("ops: host backend: %w", err)
		}
		return s, func() error { return nil }, nil
	}
	s, err := t.ReadFloat32()
	if err != nil {
		return nil, nil, fmt.Errorf("ops: host backend: %w", err)
	}
	return s, func() error { return t.WriteFloat32(s) }, nil
}

func (h *hostImpl) groupedFwd(y, x, w, b, offsets *tensor.Tensor, s ggShape, acc bool) error {
	off, err := hostOffsets(offsets, s.t)
	if err != nil {
		return err
	}
	ins, err := hostIns(x, w, b)
	if err != nil {
		return err
	}
	xs, ws, bs := ins[0], ins[1], ins[2]
	ys, commit, err := hostRowsOut(y)
	if err != nil {
		return err
	}
	beta := float32(0)
	if acc {
		beta = 1
	}
	for g := 0; g < s.e; g++ {
		r0, r1 := int(off[g]), int(off[g+1])
		if r1 == r0 {
			continue
		}
		out := ys[r0*s.n : r1*s.n]
		if s.k > 0 {
			h.blas.Sgemm(blas.NoTrans, blas.Trans, r1-r0, s.n, s.k, 1, xs[r0*s.k:], s.k, ws[g*s.n*s.k:], s.k, beta, out, s.n)
		} else if !acc {
			clear(out)
		}
		if bs != nil {
			for r := 0; r < r1-r0; r++ {
				row := out[r*s.n : (r+1)*s.n]
				for n := range row {
					row[n] += bs[g*s.n+n]
				}
			}
		}
	}
	return commit()
}

func (h *hostImpl) groupedBwd(dx, dw, db, dy, x, w, offsets *tensor.Tensor, s ggShape, acc [3]bool) error {
	off, err := hostOffsets(offsets, s.t)
	if err != nil {
		return err
	}
	ins, err := hostIns(dy, x, w)
	if err != nil {
		return err
	}
	gs, xs, ws := ins[0], ins[1], ins[2]
	beta := func(a bool) float32 {
		if a {
			return 1
		}
		return 0
	}
	if dx != nil && s.k > 0 {
		dxs, commit, err := hostRowsOut(dx)
		if err != nil {
			return err
		}
		for g := 0; g < s.e; g++ {
			r0, r1 := int(off[g]), int(off[g+1])
			if r1 > r0 {
				// dx[R_g, K] (+)= dy[R_g, N]·w[g][N, K]
				h.blas.Sgemm(blas.NoTrans, blas.NoTrans, r1-r0, s.k, s.n, 1, gs[r0*s.n:], s.n, ws[g*s.n*s.k:], s.k,
					beta(acc[0]), dxs[r0*s.k:r1*s.k], s.k)
			}
		}
		if err := commit(); err != nil {
			return err
		}
	}
	if dw != nil && s.k > 0 {
		dws, commit, err := hostOut(dw, acc[1])
		if err != nil {
			return err
		}
		for g := 0; g < s.e; g++ {
			r0, r1 := int(off[g]), int(off[g+1])
			out := dws[g*s.n*s.k : (g+1)*s.n*s.k]
			if r1 == r0 {
				clear(out)
				continue
			}
			// dw[g][N, K] = dy[R_g, N]ᵀ·x[R_g, K]
			h.blas.Sgemm(blas.Trans, blas.NoTrans, s.n, s.k, r1-r0, 1, gs[r0*s.n:], s.n, xs[r0*s.k:], s.k, 0, out, s.k)
		}
		if err := commit(); err != nil {
			return err
		}
	}
	if db != nil {
		sums := make([]float64, s.e*s.n)
		for g := 0; g < s.e; g++ {
			for r := int(off[g]); r < int(off[g+1]); r++ {
				for n, v := range gs[r*s.n : (r+1)*s.n] {
					sums[g*s.n+n] += float64(v)
				}
			}
		}
		return hostOut64(db, acc[2], sums)
	}
	return nil
}

// ---- CUDA ----

// ggPass names the three products of groupedgemm.cu.
type ggPass int

const (
	ggFwd ggPass = iota
	ggDX
	ggDW
)

func (p ggPass) String() string { return [...]string{"fwd", "dx", "dw"}[p] }

// groupedPath chooses the CUDA kernels of bf16 grouped products (tests and
// benchmarks compare them, SetGroupedPath): 0 the default (wgmma with
// 128 × 256 tiles on sm_90a, else CUDA cores), 1 wgmma with 128 × 128
// tiles, 2 CUDA cores; 3, 4, 5 the forward's bound probes (bf16 out,
// gg_wg_fwd_256_bf16_probe{1,2,3}: loads without wgmma, wgmma without
// loads, no epilogue stores), whose results are wrong: benchmarks only.
var groupedPath = 0

// ggHopperState caches whether groupedgemm.cu was compiled with its wgmma
// kernels (sm_90a).
type ggHopperState struct{ wgModule }

// ggHopper reports whether the wgmma kernels exist: the module was built
// for sm_90a and lacks the gg_wg_unavailable marker (wgModule.has).
// Decided once per engine.
func (c *cudaImpl) ggHopper() bool {
	return exec.StateOf[ggHopperState](c.CUDA).has(c, launch.GgWgUnavailableKernel)
}

// grouped launches pass p with a (everything but the dtypes filled in):
// gg_wg_<pass>_<BN>_<out> (256 threads, one block per multiprocessor)
// for bf16 operands when the wgmma kernels exist, vec holds (the
// contiguous dimensions are multiples of 8) and the tensors ts are 16-byte
// aligned; else gg_simt_<pass>_<in>_<out>.
func (c *cudaImpl) grouped(p ggPass, a *launch.GgArgs, in, out tensor.DType, vec bool, ts ...*tensor.Tensor) error {
	rowsM := int64(a.M) // the fixed M of dw; fwd and dx tile the groups' rows
	tiles := func(bm, bn int64) int64 {
		ntn := (int64(a.N) + bn - 1) / bn
		if p == ggDW {
			return int64(a.E) * ((rowsM + bm - 1) / bm) * ntn
		}
		return ((int64(a.Rows)+bm-1)/bm + int64(a.E)) * ntn // Σ⌈M_g/bm⌉ ≤ ⌈T/bm⌉ + E
	}
	if in == tensor.BF16 && groupedPath != 2 && vec && aligned16(ts...) && c.ggHopper() {
		bn, stages := int64(256), int64(4)
		if groupedPath == 1 {
			bn, stages = 128, 6
		}
		grid := min(tiles(128, bn), int64(c.SMCount()))
		smem := uint32(stages*(128*64*2+bn*64*2) + 1024)
		if groupedPath >= 3 && p == ggFwd && out == tensor.BF16 {
			// bn is 256 on these paths: gg_wg_fwd_256_bf16_probe<k>.
			return launch.GgWgFwd256Bf16Probe(c, strconv.Itoa(groupedPath-2), grid1(int(grid)), block1(256), smem, a)
		}
		return launch.GgWg(c, fmt.Sprintf("%v_%d%s", p, bn, dtSuffix(out)), grid1(int(grid)), block1(256), smem, a)
	}
	grid := min(tiles(64, 64), int64(4*c.SMCount()))
	return launch.GgSimt(c, fmt.Sprintf("%v%s%s", p, dtSuffix(in), dtSuffix(out)), grid1(int(grid)), block1(256), 0, a)

}

// ---- graph ----

// GroupedLinear records y = x·w[g]ᵀ + b[g] for the rows of each group g
// (Engine.GroupedMatmul): x [T, K]; w [E, N, K] (an f32 master: each
// expert's nn.Linear weight); b [E, N] or nil; offsets i32 [E+1] on the
// device, written before this node runs by an earlier node (the MoE
// routing); y [T, N] in the graph's activation dtype. Under bf16 autocast
// x, w and b are used through bf16 copies whose gradients land in the f32
// masters. Rows outside every group are neither written nor given a
// gradient: the routing covers every row.
func (g *Graph) GroupedLinear(x, w, b *Var, offsets *tensor.Tensor) *Var {
	if !g.ok(x, w) {
		return nil
	}
	if x.Value.Rank() != 2 || w.Value.Rank() != 3 || x.Value.Dim(1) != w.Value.Dim(2) ||
		(b != nil && (b.Value.Rank() != 2 || b.Value.Dim(0) != w.Value.Dim(0) || b.Value.Dim(1) != w.Value.Dim(1))) {
		g.Fail("grouped_linear", fmt.Errorf("%w: x %v, w %v", tensor.ErrShape, x.Value.Shape, w.Value.Shape))
		return nil
	}
	if offsets == nil || offsets.DType != tensor.I32 {
		g.Fail("grouped_linear", fmt.Errorf("%w: offsets must be i32", tensor.ErrDType))
		return nil
	}
	dt := g.ActDType()
	x, w = g.Cast(x, dt), g.Cast(w, dt)
	in := []*Var{x, w}
	if b != nil {
		b = g.Cast(b, dt)
		in = append(in, b)
	}
	y := g.NewOut("grouped_linear", dt, x.Value.Dim(0), w.Value.Dim(1))
	if !g.ok(y) || !g.ok(in...) {
		return nil
	}
	e := g.e
	g.Record("grouped_linear", in, []*Var{y}, func(*Grads) error {
		var bv *tensor.Tensor
		if b != nil {
			bv = b.Value
		}
		return e.GroupedMatmul(y.Value, x.Value, w.Value, bv, offsets, false)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil {
			return nil
		}
		var db *tensor.Tensor
		if b != nil {
			db = gr.In(2)
		}
		return e.GroupedMatmulBackward(gr.In(0), gr.In(1), db, dy, x.Value, w.Value, offsets,
			[3]bool{gr.Acc(0), gr.Acc(1), gr.Acc(2)})
	})
	return y
}
