package ops

// The routing family: dropless token-choice routing of a Mixture-of-
// Experts layer — the router's top-k, a stable counting sort of the
// tokens' choices by expert (per-expert counts and row offsets computed on
// the device), the permutation of tokens to expert order and back, the
// weighted combine of the k expert outputs, the Switch load-balancing loss
// and the router z-loss — each with its backward, and the Graph methods a
// MoE layer records (RouterLogits, MoERoute, MoEPermute, MoECombine). No
// token is dropped (no capacity factor), and nothing is read back to the
// host, so the whole layer is captured in a CUDA graph with the grouped
// GEMMs (groupedgemm.go) between the permutations. Kernels:
// libgpu/kernels/routing.cu; reference and checks: opstest/routing.go.

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// MoEMaxTopK bounds the experts per token (MOE_KMAX).
const MoEMaxTopK = 32

var i32Type = []tensor.DType{tensor.I32}

// checkTopK validates logits f32 [T, E] and experts i32 [T, k] (1 ≤ k ≤
// min(E, MoEMaxTopK), E ≤ GroupedMaxGroups), both contiguous.
func (e *Engine) checkTopK(op string, logits, experts *tensor.Tensor) (t, ne, k int, err error) {
	if err := e.checkView(op+" logits", logits, true, []tensor.DType{tensor.F32}); err != nil {
		return 0, 0, 0, err
	}
	if err := e.checkView(op+" experts", experts, true, i32Type); err != nil {
		return 0, 0, 0, err
	}
	if logits.Rank() != 2 || experts.Rank() != 2 || experts.Dim(0) != logits.Dim(0) {
		return 0, 0, 0, fmt.Errorf("%w: %s logits %v, experts %v (want [T, E] and [T, k])", tensor.ErrShape, op, logits.Shape, experts.Shape)
	}
	t, ne, k = logits.Dim(0), logits.Dim(1), experts.Dim(1)
	if ne < 1 || ne > GroupedMaxGroups || k < 1 || k > min(ne, MoEMaxTopK) {
		return 0, 0, 0, fmt.Errorf("%w: %s of top-%d among %d experts (want 1 ≤ k ≤ min(E, %d), E ≤ %d)", ErrConfig, op, k, ne, MoEMaxTopK, GroupedMaxGroups)
	}
	return t, ne, k, checkDims(t * ne)
}

// MoETopK computes each token's k largest router logits (ties: the lower
// expert first; NaN counts as −∞) into experts (i32 [T, k], in decreasing
// order) and their softmax over the k chosen — the renormalised top-k
// probabilities p_e/Σ_chosen p, p = softmax(logits) (Shazeer et al. 2017,
// "Outrageously Large Neural Networks"; Mixtral's and nanoMoE's router) —
// into weights (f32 [T, k]). logits f32 [T, E]; 1 ≤ k ≤ min(E, 32); E ≤
// GroupedMaxGroups. Errors wrap tensor.ErrShape, tensor.ErrDType,
// tensor.ErrLayout, exec.ErrDevice or ErrConfig.
func (e *Engine) MoETopK(weights, experts, logits *tensor.Tensor) error {
	t, ne, k, err := e.checkTopK("moe top-k", logits, experts)
	if err != nil {
		return err
	}
	if err := e.checkView("moe top-k weights", weights, true, []tensor.DType{tensor.F32}, t, k); err != nil {
		return err
	}
	if t == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		z, err := logits.F32()
		if err != nil {
			return err
		}
		ex, err := experts.I32()
		if err != nil {
			return err
		}
		w, err := weights.F32()
		if err != nil {
			return err
		}
		idx := make([]int, ne)
		for r := 0; r < t; r++ {
			row := z[r*ne : (r+1)*ne]
			val := func(i int) float64 {
				if v := float64(row[i]); !math.IsNaN(v) {
					return v
				}
				return math.Inf(-1)
			}
			for i := range idx {
				idx[i] = i
			}
			slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(val(b), val(a)) })
			var s float64
			for j := 0; j < k; j++ {
				s += math.Exp(val(idx[j]) - val(idx[0]))
			}
			for j := 0; j < k; j++ {
				ex[r*k+j] = int32(idx[j])
				w[r*k+j] = float32(math.Exp(val(idx[j])-val(idx[0])) / s)
			}
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.MoeTopk(c, grid1(min((t+7)/8, 65535)), block1(256), 0,
			devPtr(weights), devPtr(experts), devPtr(logits), int32(t), int32(ne), int32(k))
	})
}

// MoETopKBackward computes the gradient of MoETopK's weights with respect
// to the logits: for token t with choices e_1..e_k and weights w,
//
//	dlogits[t, e_j] = w_j·(dweights_j − Σ_i w_i·dweights_i)
//
// (the softmax over the chosen logits' Jacobian), 0 at the experts not
// chosen (the top-k selection is piecewise constant); added to dlogits
// with acc. dlogits f32 [T, E]; dweights, weights f32 [T, k]; experts the
// forward's. Errors as MoETopK.
func (e *Engine) MoETopKBackward(dlogits, dweights, weights, experts *tensor.Tensor, acc bool) error {
	t, ne, k, err := e.checkTopK("moe top-k backward", dlogits, experts)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		what string
		v    *tensor.Tensor
	}{{"dweights", dweights}, {"weights", weights}} {
		if err := e.checkView("moe top-k backward "+c.what, c.v, true, []tensor.DType{tensor.F32}, t, k); err != nil {
			return err
		}
	}
	if t == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		ex, err := experts.I32()
		if err != nil {
			return err
		}
		ins, err := hostIns(dweights, weights)
		if err != nil {
			return err
		}
		dw, w := ins[0], ins[1]
		out := make([]float64, t*ne)
		for r := 0; r < t; r++ {
			var s float64
			for j := 0; j < k; j++ {
				s += float64(w[r*k+j]) * float64(dw[r*k+j])
			}
			for j := 0; j < k; j++ {
				i := min(max(int(ex[r*k+j]), 0), ne-1)
				out[r*ne+i] += float64(w[r*k+j]) * (float64(dw[r*k+j]) - s)
			}
		}
		return hostOut64(dlogits, acc, out)
	}, func(c *cudaImpl) error {
		return launch.MoeTopkBwd(c, grid1(min((t+7)/8, 65535)), block1(256), 0,
			devPtr(dlogits), devPtr(dweights), devPtr(weights), devPtr(experts), int32(t), int32(ne), int32(k), launch.Bool(acc))
	})
}

// MoERoute sorts the T·k choices a = t·k + j of experts (i32 [T, k],
// values in [0, E)) by expert, stably (within an expert, in token order):
// counts[i] (i32 [E]) is the choices of expert i, offsets (i32 [E+1]) their
// exclusive prefix sum (offsets[E] = T·k: the row offsets of the grouped
// GEMMs), perm (i32 [T, k]) each choice's row in expert order and rows
// (i32 [T·k]) each row's choice, so rows[perm[a]] = a. On CUDA: per-chunk
// histograms, one block scanning them, a scatter (a counting sort with no
// host synchronisation); expert ids outside [0, E) are clamped there, and
// rejected on the host. E ≤ GroupedMaxGroups. Errors as MoETopK.
func (e *Engine) MoERoute(counts, offsets, perm, rows, experts *tensor.Tensor) error {
	if err := e.checkView("moe route experts", experts, true, i32Type); err != nil {
		return err
	}
	if experts.Rank() != 2 {
		return fmt.Errorf("%w: moe route experts %v, want [T, k]", tensor.ErrShape, experts.Shape)
	}
	t, k := experts.Dim(0), experts.Dim(1)
	if err := e.checkView("moe route counts", counts, true, i32Type); err != nil {
		return err
	}
	ne := counts.Numel()
	if counts.Rank() != 1 || ne < 1 || ne > GroupedMaxGroups {
		return fmt.Errorf("%w: moe route counts %v, want [E] with 1 ≤ E ≤ %d", tensor.ErrShape, counts.Shape, GroupedMaxGroups)
	}
	for _, c := range []struct {
		what  string
		v     *tensor.Tensor
		shape []int
	}{{"offsets", offsets, []int{ne + 1}}, {"perm", perm, []int{t, k}}, {"rows", rows, []int{t * k}}} {
		if err := e.checkView("moe route "+c.what, c.v, true, i32Type, c.shape...); err != nil {
			return err
		}
	}
	n := t * k
	if err := checkDims(n); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		ex, err := experts.I32()
		if err != nil {
			return err
		}
		cs, os, ps, rs := must32(counts), must32(offsets), must32(perm), must32(rows)
		clear(cs)
		for a, x := range ex {
			if x < 0 || int(x) >= ne {
				return fmt.Errorf("%w: moe route: choice %d is expert %d of %d", ErrConfig, a, x, ne)
			}
			cs[x]++
		}
		os[0] = 0
		for i := 0; i < ne; i++ {
			os[i+1] = os[i] + cs[i]
		}
		next := append([]int32(nil), os[:ne]...)
		for a, x := range ex {
			ps[a] = next[x]
			rs[next[x]] = int32(a)
			next[x]++
		}
		return nil
	}, func(c *cudaImpl) error {
		chunks := (n + 255) / 256
		cc, err := c.Scratch("moe.route", int64(max(chunks, 1)*ne*4))
		if err != nil {
			return err
		}
		if chunks > 0 {
			if err := launch.MoeCount(c, grid1(chunks), block1(256), uint32(4*ne),
				cc, devPtr(experts), int32(n), int32(ne)); err != nil {
				return err
			}
		}
		if err := launch.MoeScan(c, grid1(1), block1(1024), 0,
			devPtr(counts), devPtr(offsets), cc, int32(chunks), int32(ne)); err != nil {
			return err
		}
		if chunks == 0 {
			return nil
		}
		return launch.MoeScatter(c, grid1(chunks), block1(256), 0,
			devPtr(perm), devPtr(rows), devPtr(experts), cc, int32(n), int32(ne))
	})
}

// must32 is the host memory of a checked, contiguous i32 host tensor.
func must32(t *tensor.Tensor) []int32 {
	s, _ := t.I32()
	return s
}

// moeVec reports whether rows of d elements of the tensors ts (and the
// tensors' starts) allow the kernels' vector instances: 8 elements (16
// bytes of bf16, two 16-byte loads of f32) at a time.
func moeVec(d int, ts ...*tensor.Tensor) bool { return d%8 == 0 && aligned16(ts...) }

// checkMoERows validates a [rows, d] float tensor of dtype dt (0: f32 or
// bf16), contiguous.
func (e *Engine) checkMoERows(what string, v *tensor.Tensor, dt tensor.DType, shape ...int) error {
	dts := floatTypes
	if dt != 0 {
		dts = []tensor.DType{dt}
	}
	if err := e.checkView(what, v, true, dts, shape...); err != nil {
		return err
	}
	if v.Rank() != 2 {
		return fmt.Errorf("%w: %s is %v, want a matrix", tensor.ErrShape, what, v.Shape)
	}
	return nil
}

// MoEPermute gathers tokens into expert order: xs[r] = x[rows[r]/k] for x
// [T, d] and xs [T·k, d] of one dtype (f32 or bf16), rows i32 [T·k] from
// MoERoute (values in [0, T·k)). Errors as MoETopK.
func (e *Engine) MoEPermute(xs, x, rows *tensor.Tensor) error {
	if err := e.checkMoERows("moe permute x", x, 0); err != nil {
		return err
	}
	t, d := x.Dim(0), x.Dim(1)
	if err := e.checkView("moe permute rows", rows, true, i32Type); err != nil {
		return err
	}
	n := rows.Numel()
	if t == 0 || n%t != 0 {
		if n == 0 {
			return nil
		}
		return fmt.Errorf("%w: moe permute of %d rows from %d tokens", tensor.ErrShape, n, t)
	}
	k := n / t
	if err := e.checkMoERows("moe permute xs", xs, x.DType, n, d); err != nil {
		return err
	}
	return e.dispatch(func(*hostImpl) error {
		rs := must32(rows)
		xv, err := hostIn(x)
		if err != nil {
			return err
		}
		out, commit, err := hostOut(xs, false)
		if err != nil {
			return err
		}
		for r, a := range rs {
			if a < 0 || int(a) >= n {
				return fmt.Errorf("%w: moe permute row %d from choice %d of %d", ErrConfig, r, a, n)
			}
			copy(out[r*d:(r+1)*d], xv[int(a)/k*d:])
		}
		return commit()
	}, func(c *cudaImpl) error {
		kernel, v := launch.MoePermuteS, 1
		if d*x.DType.Size()%16 == 0 && aligned16(x, xs) {
			kernel, v = launch.MoePermuteV, 16/x.DType.Size()
		}
		return kernel(c, dtName(x.DType), gridFor(int64(n)*int64(d/v), 256), block1(256), 0,
			devPtr(xs), devPtr(x), devPtr(rows), int64(n), int32(d), int32(k))
	})
}

// MoEPermuteBackward is MoEPermute's gradient: dx[t] = Σ_j dxs[perm[t, j]]
// (added to dx with acc) in f32, a gather in a fixed order (no atomics).
// dx [T, d], dxs [T·k, d] of one dtype; perm i32 [T, k] from MoERoute.
// Errors as MoETopK.
func (e *Engine) MoEPermuteBackward(dx, dxs, perm *tensor.Tensor, acc bool) error {
	if err := e.checkMoERows("moe permute backward dx", dx, 0); err != nil {
		return err
	}
	t, d := dx.Dim(0), dx.Dim(1)
	if err := e.checkView("moe permute backward perm", perm, true, i32Type); err != nil {
		return err
	}
	if perm.Rank() != 2 || perm.Dim(0) != t {
		return fmt.Errorf("%w: moe permute backward perm %v for %d tokens", tensor.ErrShape, perm.Shape, t)
	}
	k := perm.Dim(1)
	if err := e.checkMoERows("moe permute backward dxs", dxs, dx.DType, t*k, d); err != nil {
		return err
	}
	if t == 0 || d == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		ps := must32(perm)
		g, err := hostIn(dxs)
		if err != nil {
			return err
		}
		out := make([]float64, t*d)
		for a, r := range ps {
			if r < 0 || int(r) >= t*k {
				return fmt.Errorf("%w: moe permute backward: choice %d at row %d of %d", ErrConfig, a, r, t*k)
			}
			row := out[a/k*d : (a/k+1)*d]
			for c, v := range g[int(r)*d : (int(r)+1)*d] {
				row[c] += float64(v)
			}
		}
		return hostOut64(dx, acc, out)
	}, func(c *cudaImpl) error {
		kernel, v := launch.MoePermuteBwdS, 1
		if moeVec(d, dx, dxs) {
			kernel, v = launch.MoePermuteBwdV, 8
		}
		return kernel(c, dtName(dx.DType), gridFor(int64(t)*int64(d/v), 256), block1(256), 0,
			devPtr(dx), devPtr(dxs), devPtr(perm), int64(t), int32(d), int32(k), launch.Bool(acc))
	})
}

// checkCombine validates MoECombine's tensors: ys [T·k, d], weights f32
// [T, k], perm i32 [T, k]; returns T, k, d.
func (e *Engine) checkCombine(op string, ys, weights, perm *tensor.Tensor) (t, k, d int, err error) {
	if err := e.checkMoERows(op+" ys", ys, 0); err != nil {
		return 0, 0, 0, err
	}
	if err := e.checkView(op+" weights", weights, true, []tensor.DType{tensor.F32}); err != nil {
		return 0, 0, 0, err
	}
	if weights.Rank() != 2 {
		return 0, 0, 0, fmt.Errorf("%w: %s weights %v, want [T, k]", tensor.ErrShape, op, weights.Shape)
	}
	t, k, d = weights.Dim(0), weights.Dim(1), ys.Dim(1)
	if ys.Dim(0) != t*k {
		return 0, 0, 0, fmt.Errorf("%w: %s ys %v for weights %v", tensor.ErrShape, op, ys.Shape, weights.Shape)
	}
	if err := e.checkView(op+" perm", perm, true, i32Type, t, k); err != nil {
		return 0, 0, 0, err
	}
	return t, k, d, nil
}

// MoECombine computes y[t] = Σ_j weights[t, j]·ys[perm[t, j]] in f32: the
// k expert outputs of each token, weighted by its router weights, back in
// token order. ys [T·k, d] and y [T, d] of one dtype (f32 or bf16);
// weights f32 [T, k] (MoETopK); perm i32 [T, k] (MoERoute). Errors as
// MoETopK.
func (e *Engine) MoECombine(y, ys, weights, perm *tensor.Tensor) error {
	t, k, d, err := e.checkCombine("moe combine", ys, weights, perm)
	if err != nil {
		return err
	}
	if err := e.checkMoERows("moe combine y", y, ys.DType, t, d); err != nil {
		return err
	}
	if t == 0 || d == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		ps := must32(perm)
		ins, err := hostIns(ys, weights)
		if err != nil {
			return err
		}
		yv, w := ins[0], ins[1]
		out := make([]float64, t*d)
		for a, r := range ps {
			if r < 0 || int(r) >= t*k {
				return fmt.Errorf("%w: moe combine: choice %d at row %d of %d", ErrConfig, a, r, t*k)
			}
			row, wa := out[a/k*d:(a/k+1)*d], float64(w[a])
			for c, v := range yv[int(r)*d : (int(r)+1)*d] {
				row[c] += wa * float64(v)
			}
		}
		return hostOut64(y, false, out)
	}, func(c *cudaImpl) error {
		kernel, v := launch.MoeCombineS, 1
		if moeVec(d, y, ys) {
			kernel, v = launch.MoeCombineV, 8
		}
		return kernel(c, dtName(y.DType), gridFor(int64(t)*int64(d/v), 256), block1(256), 0,
			devPtr(y), devPtr(ys), devPtr(weights), devPtr(perm), int64(t), int32(d), int32(k))
	})
}

// MoECombineBackward computes MoECombine's gradients from dy [T, d]:
//
//	dys[perm[t, j]] = weights[t, j]·dy[t]
//	dweights[t, j] = ⟨dy[t], ys[perm[t, j]]⟩
//
// dys of ys's shape and dtype, dweights f32 [T, k]; either may be nil;
// acc[0], acc[1] add to them. Errors as MoETopK.
func (e *Engine) MoECombineBackward(dys, dweights, dy, ys, weights, perm *tensor.Tensor, acc [2]bool) error {
	t, k, d, err := e.checkCombine("moe combine backward", ys, weights, perm)
	if err != nil {
		return err
	}
	if err := e.checkMoERows("moe combine backward dy", dy, ys.DType, t, d); err != nil {
		return err
	}
	if dys != nil {
		if err := e.checkMoERows("moe combine backward dys", dys, ys.DType, t*k, d); err != nil {
			return err
		}
	}
	if dweights != nil {
		if err := e.checkView("moe combine backward dweights", dweights, true, []tensor.DType{tensor.F32}, t, k); err != nil {
			return err
		}
	}
	if t == 0 || (dys == nil && dweights == nil) {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		ps := must32(perm)
		ins, err := hostIns(dy, ys, weights)
		if err != nil {
			return err
		}
		g, yv, w := ins[0], ins[1], ins[2]
		gys, gw := make([]float64, t*k*d), make([]float64, t*k)
		for a, r := range ps {
			if r < 0 || int(r) >= t*k {
				return fmt.Errorf("%w: moe combine backward: choice %d at row %d of %d", ErrConfig, a, r, t*k)
			}
			grow, yrow := g[a/k*d:(a/k+1)*d], yv[int(r)*d:(int(r)+1)*d]
			var s float64
			for c := range grow {
				s += float64(grow[c]) * float64(yrow[c])
				gys[int(r)*d+c] = float64(w[a]) * float64(grow[c])
			}
			gw[a] = s
		}
		if dys != nil {
			if err := hostOut64(dys, acc[0], gys); err != nil {
				return err
			}
		}
		if dweights != nil {
			return hostOut64(dweights, acc[1], gw)
		}
		return nil
	}, func(c *cudaImpl) error {
		return launch.MoeCombineBwd(c, dtName(ys.DType), grid1(min((t+7)/8, 65535)), block1(256), 0,
			devPtr(dys), devPtr(dweights), devPtr(dy), devPtr(ys), devPtr(weights), devPtr(perm), int32(t), int32(d), int32(k), launch.Bool(acc[0]), launch.Bool(acc[1]))
	})
}

// MoEAuxLoss computes a MoE layer's auxiliary losses into losses (f32 [2]):
//
//	losses[0] = E·Σ_i f_i·P_i    (the Switch load-balancing loss; Fedus,
//	            Zoph & Shazeer 2021, "Switch Transformers", eq. 4)
//	losses[1] = (1/T)·Σ_t logsumexp(logits[t])²   (the router z-loss;
//	            Zoph et al. 2022, "ST-MoE", eq. 5)
//
// f_i = counts[i]/T, the choices of expert i per token (each of a token's
// k choices counted, so Σ f_i = k: nanoMoE's and HF Mixtral's
// convention; the loss is k when the routing is uniform), P_i = (1/T)·Σ_t
// softmax(logits[t])_i; f is piecewise constant and gets no gradient.
// With dlogits (f32 [T, E]; nil: the values only) it also writes, or adds
// with acc, the gradient of aux·losses[0] + z·losses[1]: dlogits[t, i] =
// p_ti·(g_i − Σ_j p_tj·g_j) + z·(2/T)·lse_t·p_ti with g_i = aux·E·f_i/T.
// logits f32 [T, E]; counts i32 [E] (MoERoute). Errors as MoETopK.
func (e *Engine) MoEAuxLoss(losses, dlogits, logits, counts *tensor.Tensor, aux, z float32, acc bool) error {
	if err := e.checkView("moe aux loss logits", logits, true, []tensor.DType{tensor.F32}); err != nil {
		return err
	}
	if logits.Rank() != 2 || logits.Dim(1) < 1 || logits.Dim(1) > GroupedMaxGroups {
		return fmt.Errorf("%w: moe aux loss logits %v, want [T, E] with 1 ≤ E ≤ %d", tensor.ErrShape, logits.Shape, GroupedMaxGroups)
	}
	t, ne := logits.Dim(0), logits.Dim(1)
	if err := e.checkView("moe aux loss counts", counts, true, i32Type, ne); err != nil {
		return err
	}
	if err := e.checkView("moe aux loss losses", losses, true, []tensor.DType{tensor.F32}, 2); err != nil {
		return err
	}
	if dlogits != nil {
		if err := e.checkView("moe aux loss dlogits", dlogits, true, []tensor.DType{tensor.F32}, t, ne); err != nil {
			return err
		}
	}
	if t == 0 {
		return e.Fill(losses, 0)
	}
	return e.dispatch(func(*hostImpl) error {
		zs, err := logits.F32()
		if err != nil {
			return err
		}
		cs := must32(counts)
		invT := 1 / float64(t)
		g := make([]float64, ne)
		for i, c := range cs {
			g[i] = float64(aux) * float64(ne) * float64(c) * invT * invT
		}
		colsum := make([]float64, ne)
		var zsum float64
		grad := make([]float64, t*ne)
		p := make([]float64, ne)
		for r := 0; r < t; r++ {
			row := zs[r*ne : (r+1)*ne]
			m := math.Inf(-1)
			for _, v := range row {
				m = math.Max(m, float64(v))
			}
			var s float64
			for i, v := range row {
				p[i] = math.Exp(float64(v) - m)
				s += p[i]
			}
			lse := m + math.Log(s)
			zsum += lse * lse
			var sg float64
			for i := range p {
				p[i] /= s
				colsum[i] += p[i]
				sg += p[i] * g[i]
			}
			for i := range p {
				grad[r*ne+i] = p[i]*(g[i]-sg) + float64(z)*2*invT*lse*p[i]
			}
		}
		var a float64
		for i, c := range cs {
			a += float64(c) * invT * colsum[i] * invT
		}
		if err := losses.WriteF32([]float32{float32(float64(ne) * a), float32(zsum * invT)}); err != nil {
			return err
		}
		if dlogits != nil {
			return hostOut64(dlogits, acc, grad)
		}
		return nil
	}, func(c *cudaImpl) error {
		lse, err := c.Scratch("moe.aux.lse", int64(t)*4)
		if err != nil {
			return err
		}
		col, err := c.Scratch("moe.aux.col", int64(ne)*4)
		if err != nil {
			return err
		}
		if err := launch.MoeAuxRows(c, grid1(min((t+7)/8, 65535)), block1(256), 0,
			devPtr(dlogits), lse, devPtr(logits), devPtr(counts), int32(t), int32(ne), aux, z, launch.Bool(acc)); err != nil {
			return err
		}
		if err := launch.MoeAuxCols(c, grid1((ne+31)/32), [3]uint32{32, 8, 1}, 0,
			col, devPtr(logits), lse, int32(t), int32(ne)); err != nil {
			return err
		}
		return launch.MoeAuxFinal(c, grid1(1), block1(256), 0, devPtr(losses), col, devPtr(counts), lse, int32(t), int32(ne))
	})
}

// ---- graph ----

// RouterLogits records a MoE router's logits = x·wᵀ in f32 whatever the
// graph's autocast (nanoMoE and ST-MoE keep the router in full precision):
// x [T, d] (f32, or bf16 activations, widened to f32: under bf16 the
// router reads what the experts read, as Megatron-Core's fp32 router casts
// its bf16 hidden states up), w [E, d] an f32 parameter; logits f32 [T, E].
// The products are full f32 (no TF32).
func (g *Graph) RouterLogits(x, w *Var) *Var {
	if !g.ok(x, w) {
		return nil
	}
	xv, wv := x.Value, w.Value
	if xv.Rank() != 2 || wv.Rank() != 2 || xv.Dim(1) != wv.Dim(1) || wv.DType != tensor.F32 {
		g.Fail("router", fmt.Errorf("%w: router x %v, w %v %v (want [T, d] and f32 [E, d])", tensor.ErrShape, xv.Shape, wv.DType, wv.Shape))
		return nil
	}
	t, d, ne := xv.Dim(0), xv.Dim(1), wv.Dim(0)
	logits := g.NewOut("router", tensor.F32, t, ne)
	out := []*Var{logits}
	var x32, dx32 *Var // f32 copies of a bf16 x and of its gradient
	if xv.DType != tensor.F32 {
		x32, dx32 = g.NewOut("router.x32", tensor.F32, t, d), g.NewOut("router.dx32", tensor.F32, t, d)
		out = append(out, x32, dx32)
	}
	if !g.ok(out...) {
		return nil
	}
	e := g.e
	xf := func() *tensor.Tensor {
		if x32 != nil {
			return x32.Value
		}
		return xv
	}
	g.Record("router", []*Var{x, w}, out, func(*Grads) error {
		if x32 != nil {
			if err := e.Cast(x32.Value, xv); err != nil {
				return err
			}
		}
		return e.Matmul(Matmul{A: xf(), B: wv, D: logits.Value, TransB: true, FullF32: true})
	}, func(gr *Grads) error {
		dl := gr.Out(0)
		if dl == nil {
			return nil
		}
		if dw := gr.In(1); dw != nil {
			if err := e.Matmul(Matmul{A: dl, B: xf(), D: dw, TransA: true, Accumulate: gr.Acc(1), FullF32: true}); err != nil {
				return err
			}
		}
		dx := gr.In(0)
		if dx == nil {
			return nil
		}
		if dx32 == nil {
			return e.Matmul(Matmul{A: dl, B: wv, D: dx, Accumulate: gr.Acc(0), FullF32: true})
		}
		if err := e.Matmul(Matmul{A: dl, B: wv, D: dx32.Value, FullF32: true}); err != nil {
			return err
		}
		return e.Scale(dx, dx32.Value, 1, gr.Acc(0))
	})
	return logits
}

// MoERouting is what Graph.MoERoute records for T tokens routed to k of E
// experts each: the differentiable router weights, the routing's i32
// tensors (written by the routing's node in the forward; read by later
// nodes: GroupedLinear takes Offsets) and the auxiliary losses.
type MoERouting struct {
	T, E, K int
	Weights *Var           // f32 [T, k]: renormalised top-k probabilities
	Experts *tensor.Tensor // i32 [T, k]: each token's experts, best first
	Counts  *tensor.Tensor // i32 [E]: choices per expert
	Offsets *tensor.Tensor // i32 [E+1]: the experts' first rows in expert order
	Perm    *tensor.Tensor // i32 [T, k]: each choice's row in expert order
	Rows    *tensor.Tensor // i32 [T·k]: each row's choice
	// Losses (f32 [2]) holds the load-balancing loss and the z-loss
	// (Engine.MoEAuxLoss), unscaled; a loss node: their gradients, scaled
	// by the coefficients given to MoERoute, flow into the logits.
	Losses *Var
}

// MoERoute records dropless top-k routing of logits (f32 [T, E], from
// RouterLogits): Engine.MoETopK, Engine.MoERoute, and Engine.MoEAuxLoss
// as a loss node whose gradient aux·∂L_aux + z·∂L_z joins the logits'
// (the objective gains aux·losses[0] + z·losses[1]). The weights'
// gradient flows to the logits through the chosen experts' softmax
// (MoETopKBackward); the choices themselves are piecewise constant.
func (g *Graph) MoERoute(logits *Var, k int, aux, z float32) *MoERouting {
	if !g.ok(logits) {
		return nil
	}
	lv := logits.Value
	if lv.DType != tensor.F32 || lv.Rank() != 2 || k < 1 || k > min(lv.Dim(1), MoEMaxTopK) || lv.Dim(1) > GroupedMaxGroups {
		g.Fail("moe_route", fmt.Errorf("%w: top-%d routing of logits %v %v", ErrConfig, k, lv.DType, lv.Shape))
		return nil
	}
	t, ne := lv.Dim(0), lv.Dim(1)
	r := &MoERouting{T: t, E: ne, K: k}
	r.Weights = g.NewOut("moe.weights", tensor.F32, t, k)
	ex := g.NewOut("moe.experts", tensor.I32, t, k)
	counts, offsets := g.NewOut("moe.counts", tensor.I32, ne), g.NewOut("moe.offsets", tensor.I32, ne+1)
	perm, rows := g.NewOut("moe.perm", tensor.I32, t, k), g.NewOut("moe.rows", tensor.I32, t*k)
	r.Losses = g.NewOut("moe.losses", tensor.F32, 2)
	if !g.ok(r.Weights, ex, counts, offsets, perm, rows, r.Losses) {
		return nil
	}
	r.Experts, r.Counts, r.Offsets, r.Perm, r.Rows = ex.Value, counts.Value, offsets.Value, perm.Value, rows.Value
	e := g.e
	g.Record("moe_topk", []*Var{logits}, []*Var{r.Weights, ex}, func(*Grads) error {
		return e.MoETopK(r.Weights.Value, r.Experts, lv)
	}, func(gr *Grads) error {
		dw, dl := gr.Out(0), gr.In(0)
		if dw == nil || dl == nil {
			return nil
		}
		return e.MoETopKBackward(dl, dw, r.Weights.Value, r.Experts, gr.Acc(0))
	})
	// The i32 tensors are outputs of a node with no differentiable input,
	// and later nodes read them without listing them: no gradient buffers.
	g.Record("moe_route", nil, []*Var{counts, offsets, perm, rows}, func(*Grads) error {
		return e.MoERoute(r.Counts, r.Offsets, r.Perm, r.Rows, r.Experts)
	}, nil)
	g.RecordLoss("moe_aux", []*Var{logits}, r.Losses, func(gr *Grads) error {
		return e.MoEAuxLoss(r.Losses.Value, gr.In(0), lv, r.Counts, aux, z, gr.Acc(0))
	})
	if g.Err() != nil {
		return nil
	}
	return r
}

// MoEPermute records xs = x's rows in expert order (Engine.MoEPermute):
// x [T, d], xs [T·k, d] of x's dtype.
func (g *Graph) MoEPermute(x *Var, r *MoERouting) *Var {
	if !g.ok(x) || r == nil {
		g.ok(nil)
		return nil
	}
	if x.Value.Rank() != 2 || x.Value.Dim(0) != r.T {
		g.Fail("moe_permute", fmt.Errorf("%w: moe permute of x %v for %d tokens", tensor.ErrShape, x.Value.Shape, r.T))
		return nil
	}
	xs := g.NewOut("moe.permute", x.Value.DType, r.T*r.K, x.Value.Dim(1))
	e := g.e
	g.Record("moe_permute", []*Var{x}, []*Var{xs}, func(*Grads) error {
		return e.MoEPermute(xs.Value, x.Value, r.Rows)
	}, func(gr *Grads) error {
		dxs, dx := gr.Out(0), gr.In(0)
		if dxs == nil || dx == nil {
			return nil
		}
		return e.MoEPermuteBackward(dx, dxs, r.Perm, gr.Acc(0))
	})
	return xs
}

// MoECombine records y[t] = Σ_j weights[t, j]·ys[perm[t, j]]
// (Engine.MoECombine): ys [T·k, d] (the experts' outputs in expert order),
// y [T, d] of ys's dtype; gradients to ys and to the router weights.
func (g *Graph) MoECombine(ys *Var, r *MoERouting) *Var {
	if !g.ok(ys) || r == nil {
		g.ok(nil)
		return nil
	}
	if ys.Value.Rank() != 2 || ys.Value.Dim(0) != r.T*r.K {
		g.Fail("moe_combine", fmt.Errorf("%w: moe combine of ys %v for %d×%d choices", tensor.ErrShape, ys.Value.Shape, r.T, r.K))
		return nil
	}
	y := g.NewOut("moe.combine", ys.Value.DType, r.T, ys.Value.Dim(1))
	e := g.e
	g.Record("moe_combine", []*Var{ys, r.Weights}, []*Var{y}, func(*Grads) error {
		return e.MoECombine(y.Value, ys.Value, r.Weights.Value, r.Perm)
	}, func(gr *Grads) error {
		dy := gr.Out(0)
		if dy == nil {
			return nil
		}
		return e.MoECombineBackward(gr.In(0), gr.In(1), dy, ys.Value, r.Weights.Value, r.Perm, [2]bool{gr.Acc(0), gr.Acc(1)})
	})
	return y
}
