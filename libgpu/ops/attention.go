package ops

// The attention family: scaled dot-product attention, forward and
// backward (FlashAttention-2's algorithm: online softmax over key tiles,
// log-sum-exp saved, P recomputed in the backward) with optional dropout
// on the attention probabilities (AttnDropout), decoding against a KV
// cache, and Graph.SelfAttention over a fused qkv projection. Kernels:
// libgpu/kernels/attention.cu (tensor cores for bf16 with D = 64 or 128,
// CUDA cores otherwise). Reference and checks: opstest/attention.go.

import (
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"

	"gonum.org/v1/gonum/blas"

	"gpukit/libgpu/exec"
	"gpukit/libgpu/kernels/launch"
	"gpukit/libgpu/tensor"
)

// attnMaxD is the largest head dimension the kernels take (each lane of a
// warp owns at most 4 of the columns); attnWideD the one wider head
// dimension the forward takes besides (FlashAttention-3's hdim 256): on
// the host, and on a GPU through attn_fwd_ws_d256 (attnFwdWide).
const (
	attnMaxD  = 128
	attnWideD = 256
)

// attnWide lets the GPU forward take head dimension attnWideD
// (attn_fwd_ws_d256: bf16, sm_90a, no dropout). On since it ran on a GPU
// (one H200, 2026-11-29: o and lse against the float64 reference; SDPA's
// time over ours 1.01 causal, 0.92 non-causal at (4,16,2048,256)); tests
// turn it off (SetAttentionWide).
var attnWide = true

// errAttnWide is the error of a call at head dimension attnWideD that no
// kernel takes.
func errAttnWide(what string) error {
	if what == "forward" && !attnWide {
		return fmt.Errorf("%w: attention forward at head dimension %d: its GPU kernel is turned off; the GPU kernels take 1..%d, the host takes %d too",
			ErrConfig, attnWideD, attnMaxD, attnWideD)
	}
	return fmt.Errorf("%w: attention %s at head dimension %d: the GPU kernels take 1..%d; %d has a forward only, bf16 without dropout on an sm_90a GPU, or on the host",
		ErrConfig, what, attnWideD, attnMaxD, attnWideD)
}

// attnShape is a validated attention call's geometry.
type attnShape struct{ b, tq, tk, h, d int }

// checkAttn validates q [B,Tq,H,D], k and v [B,Tk,H,D] (f32 or bf16, one
// dtype, the last dimension contiguous) and returns the geometry.
func (e *Engine) checkAttn(q, k, v *tensor.Tensor, causal bool, scale float32) (attnShape, error) {
	var s attnShape
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
	}{{"q", q}, {"k", k}, {"v", v}} {
		if err := e.checkView("attention "+c.what, c.t, false, floatTypes); err != nil {
			return s, err
		}
		if c.t.Rank() != 4 {
			return s, fmt.Errorf("%w: attention %s is %v, want [B,T,H,D]", tensor.ErrShape, c.what, c.t.Shape)
		}
	}
	if k.DType != q.DType || v.DType != q.DType {
		return s, fmt.Errorf("%w: attention q, k, v are %v, %v, %v (want one dtype)", tensor.ErrDType, q.DType, k.DType, v.DType)
	}
	s = attnShape{b: q.Dim(0), tq: q.Dim(1), tk: k.Dim(1), h: q.Dim(2), d: q.Dim(3)}
	if !tensor.SameShape(k.Shape, []int{s.b, s.tk, s.h, s.d}) || !tensor.SameShape(v.Shape, k.Shape) {
		return s, fmt.Errorf("%w: attention q %v, k %v, v %v", tensor.ErrShape, q.Shape, k.Shape, v.Shape)
	}
	if s.d < 1 || s.d > attnMaxD && s.d != attnWideD {
		return s, fmt.Errorf("%w: attention head dimension %d (want 1..%d, or %d for the forward)", tensor.ErrShape, s.d, attnMaxD, attnWideD)
	}
	if causal && s.tq != s.tk {
		return s, fmt.Errorf("%w: causal attention with %d queries and %d keys (want equal)", ErrConfig, s.tq, s.tk)
	}
	if s.tk == 0 && s.tq > 0 && s.b*s.h > 0 {
		return s, fmt.Errorf("%w: attention over no keys", tensor.ErrShape)
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return s, fmt.Errorf("%w: attention scale %v", ErrConfig, scale)
	}
	// Grid limits (y: batch, z: row blocks of 16) and 32-bit row counts.
	if s.b > math.MaxUint16 || max(s.tq, s.tk) > 16*math.MaxUint16 || s.h > math.MaxInt32/max(s.b, 1) {
		return s, fmt.Errorf("%w: attention of %v, %v too large", tensor.ErrShape, q.Shape, k.Shape)
	}
	return s, nil
}

// AttnDropout is dropout on the attention probabilities (nanoGPT's
// attn_dropout: F.scaled_dot_product_attention's dropout_p in training),
// applied inside AttentionForward and AttentionBackward as FlashAttention
// does (Dao et al. 2022, Algorithm 2): the mask is recomputed, never
// stored. Element (i, j) of head h of batch row b is kept as
// DropoutKeep(Seed, Site, step, n, P) says for
//
//	n = ((B0 + b)·H + h)·Tq + i)·Tk + j
//
// with step read from Counter by the device when the op runs (nil: step
// 0) — the dropout family's rule and key scheme, so a captured graph draws
// new masks as the counter moves. Kept elements are scaled by 1/(1−P). B0
// is the index of row 0 in the whole batch: a data-parallel rank holding
// rows [r·B, (r+1)·B) passes r·B and draws the single-process masks. The
// zero value (P = 0) is no dropout, bitwise the plain kernels.
type AttnDropout struct {
	P       float32
	Seed    uint64
	Site    int
	Counter *tensor.Tensor
	B0      int64
}

func (e *Engine) checkAttnDropout(d AttnDropout) error {
	if err := e.checkDropout(d.P, d.Site, d.Counter); err != nil {
		return err
	}
	if d.B0 < 0 {
		return fmt.Errorf("%w: attention dropout batch offset %d", ErrConfig, d.B0)
	}
	return nil
}

// attnDropStep reads the step counter on the host (nil: 0).
func attnDropStep(d AttnDropout) (uint32, error) {
	if d.Counter == nil {
		return 0, nil
	}
	c, err := d.Counter.I32()
	if err != nil {
		return 0, fmt.Errorf("ops: host backend: %w", err)
	}
	return uint32(c[0]), nil
}

// attnKeep is the host's keep mask for one (b, h): keep(i, j) for query i
// and key j, the groups of 4 drawn once (element n uses word n mod 4 of
// group n/4).
type attnKeep struct {
	key       [2]uint32
	site, stp uint32
	p         float32
	base      int64
	tk        int64
	last      int64
	r         [4]uint32
}

func newAttnKeep(d AttnDropout, step uint32, s attnShape, b, h int) *attnKeep {
	return &attnKeep{key: [2]uint32{uint32(d.Seed), uint32(d.Seed >> 32)}, site: uint32(d.Site), stp: step, p: d.P,
		base: ((d.B0+int64(b))*int64(s.h) + int64(h)) * int64(s.tq) * int64(s.tk), tk: int64(s.tk), last: -1}
}

func (k *attnKeep) keep(i, j int) bool {
	n := k.base + int64(i)*k.tk + int64(j)
	if q := n / 4; q != k.last {
		k.r = Philox4x32([4]uint32{uint32(q), uint32(uint64(q) >> 32), k.site, k.stp}, k.key)
		k.last = q
	}
	return dropoutU(k.r[n%4]) >= k.p
}

// checkLSE validates lse [B,H,Tq], contiguous f32.
func (e *Engine) checkLSE(lse *tensor.Tensor, s attnShape) error {
	return e.checkView("attention lse", lse, true, []tensor.DType{tensor.F32}, s.b, s.h, s.tq)
}

// AttentionForward computes scaled dot-product attention per batch item b
// and head h (PyTorch's F.scaled_dot_product_attention, FlashAttention-2's
// algorithm: Dao 2023):
//
//	S = q[b,:,h,:]·k[b,:,h,:]ᵀ·scale (+ −∞ where key j > query i, when causal)
//	o[b,:,h,:] = softmax(S)·v[b,:,h,:],   lse[b,h,i] = log Σ_j exp S_ij
//
// Shapes: q [B,Tq,H,D], k and v [B,Tk,H,D], o [B,Tq,H,D] — any strides
// with the last dimension contiguous (q, k, v are usually views of a fused
// qkv projection [B,T,3,H,D]) — and lse [B,H,Tq] contiguous f32, saved for
// AttentionBackward (nil: not stored). q, k, v, o are all f32 or all bf16;
// arithmetic is f32. 1 ≤ D ≤ 128, or D = 256 (FlashAttention-3's widest
// head; a forward only: AttentionBackward and AttentionDecode take
// D ≤ 128); causal needs Tq = Tk. scale is usually 1/√D. o must not
// overlap the inputs. On CUDA, bf16 with D = 64 or 128 and 16-byte
// aligned rows (pointers and strides multiples of 8 elements) runs on
// tensor cores; everything else on CUDA cores; D = 256 only on an sm_90a
// GPU, bf16, aligned, without dropout (elsewhere ErrConfig). drop is dropout on
// softmax(S) (AttnDropout; the zero value: none): o = (P∘mask/(1−p))·v,
// lse still the undropped log-sum-exp. Errors wrap tensor.ErrShape,
// tensor.ErrDType, tensor.ErrLayout, exec.ErrDevice or ErrConfig.
func (e *Engine) AttentionForward(o, lse, q, k, v *tensor.Tensor, causal bool, scale float32, drop AttnDropout) error {
	s, err := e.checkAttn(q, k, v, causal, scale)
	if err != nil {
		return err
	}
	if err := e.checkAttnDropout(drop); err != nil {
		return err
	}
	if err := e.checkView("attention o", o, false, []tensor.DType{q.DType}, q.Shape...); err != nil {
		return err
	}
	if lse != nil {
		if err := e.checkLSE(lse, s); err != nil {
			return err
		}
	}
	if s.b*s.h*s.tq == 0 {
		return nil
	}
	return e.dispatch(func(h *hostImpl) error { return h.attnForward(o, lse, q, k, v, s, causal, scale, drop) },
		func(c *cudaImpl) error {
			a := newAttnArgs(s, causal, scale)
			a.setDropout(drop)
			a.setQKV(q, k, v)
			a.O, a.So = devPtr(o), attnStrides(o)
			a.Lse = devPtr(lse)
			if s.d > attnMaxD {
				return c.attnFwdWide(&a, s, q.DType, q, k, v, o)
			}
			if attnTC(q.DType, s.d, q, k, v, o) {
				return c.attnFwdTC(&a, s)
			}
			return c.attnFwdSIMT(&a, s, q.DType)
		})
}

// AttentionBackward computes the gradients of AttentionForward's o with
// respect to q, k and v given do = ∂L/∂o, from the forward's o and lse
// (FlashAttention-2's backward: P = exp(S − lse) is recomputed tile by
// tile, δ_i = Σ_d do_id·o_id, dS = P∘(do·vᵀ − δ)):
//
//	dq = scale·dS·k,   dk = scale·dSᵀ·q,   dv = Pᵀ·do
//
// Shapes and dtypes as AttentionForward's (dq like q, dk and dv like k, do
// like o, all of q's dtype, any strides with the last dimension
// contiguous; lse [B,H,Tq] f32). acc[i] adds the result into dq, dk, dv
// (i = 0, 1, 2) instead of overwriting it (fan-out); a nil dq, dk or dv is
// not computed. dq, dk, dv must not overlap each other or the inputs.
// Deterministic: the CUDA kernels sum in a fixed order (a pass over key
// blocks for dk and dv, a second over query blocks for dq, with no
// atomics), so results are bitwise reproducible. Scratch: B·H·Tq f32 for
// δ. drop
// must be the forward's (same p, seed, site, B0 and counter value: run the
// backward before the counter moves); with Z = mask/(1−p) the gradients
// are dv = (P∘Z)ᵀ·do and dS = P∘(Z∘(do·vᵀ) − δ), δ from the dropped o.
func (e *Engine) AttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool, scale float32, acc [3]bool, drop AttnDropout) error {
	s, err := e.checkAttn(q, k, v, causal, scale)
	if err != nil {
		return err
	}
	if s.d > attnMaxD {
		return errAttnWide("backward")
	}
	if err := e.checkAttnDropout(drop); err != nil {
		return err
	}
	dts := []tensor.DType{q.DType}
	for _, c := range []struct {
		what string
		t    *tensor.Tensor
		like *tensor.Tensor
		opt  bool
	}{{"o", o, q, false}, {"do", do, q, false}, {"dq", dq, q, true}, {"dk", dk, k, true}, {"dv", dv, k, true}} {
		if c.opt && c.t == nil {
			continue
		}
		if err := e.checkView("attention "+c.what, c.t, false, dts, c.like.Shape...); err != nil {
			return err
		}
	}
	if err := e.checkLSE(lse, s); err != nil {
		return err
	}
	if dq == nil && dk == nil && dv == nil {
		return nil
	}
	if s.b*s.h == 0 || s.tq+s.tk == 0 {
		return nil
	}
	return e.dispatch(func(h *hostImpl) error {
		return h.attnBackward(dq, dk, dv, do, q, k, v, o, lse, s, causal, scale, acc, drop)
	}, func(c *cudaImpl) error {
		a := newAttnArgs(s, causal, scale)
		a.setDropout(drop)
		a.setQKV(q, k, v)
		a.O, a.So = devPtr(o), attnStrides(o)
		a.Lse = devPtr(lse)
		a.Dout, a.Sdo = devPtr(do), attnStrides(do)
		a.Dq, a.Sdq = devPtr(dq), attnStrides(dq)
		a.Dk, a.Sdk = devPtr(dk), attnStrides(dk)
		a.Dv, a.Sdv = devPtr(dv), attnStrides(dv)
		a.AccQ, a.AccK, a.AccV = attnBool(acc[0]), attnBool(acc[1]), attnBool(acc[2])
		if s.tq > 0 {
			delta, err := c.Scratch("attention.delta", int64(4*s.b*s.h*s.tq))
			if err != nil {
				return err
			}
			a.Delta = delta
			if err := c.attnBwdDelta(&a, s, q.DType, o, do); err != nil {
				return err
			}
		}
		tc := attnTC(q.DType, s.d, q, k, v, do, dq, dk, dv) // δ's kernel reads o at any alignment
		if dk != nil || dv != nil {
			var err error
			if tc {
				err = c.attnBwdDKDVTC(&a, s)
			} else {
				err = c.attnBwdDKDVSIMT(&a, s, q.DType)
			}
			if err != nil {
				return err
			}
		}
		if dq == nil || s.tq == 0 {
			return nil
		}
		if tc {
			return c.attnBwdDQTC(&a, s)
		}
		return c.attnBwdDQSIMT(&a, s, q.DType)
	})
}

// AttentionDecode computes one step of generation with a KV cache: for
// every batch item b and head h, the single query q[b,0,h,:] attends to
// keys 0..pos (inclusive) of kcache[b,:,h,:] and vcache[b,:,h,:]:
//
//	o[b,0,h,:] = softmax(q·kcache[b,0:pos+1,h,:]ᵀ·scale)·vcache[b,0:pos+1,h,:]
//
// q and o [B,1,H,D], kcache and vcache [B,Tmax,H,D] (any strides, the last
// dimension contiguous; q is usually a view of the step's qkv), all f32 or
// all bf16, 1 ≤ D ≤ 128. pos is an i32 scalar (one element) on the engine's
// device, read by the kernel when it runs — so a captured graph replays
// with the position the previous step advanced — and clamped to
// [0, Tmax−1]. Write the step's k and v into the caches with KVWrite first.
func (e *Engine) AttentionDecode(o, q, kcache, vcache, pos *tensor.Tensor, scale float32) error {
	s, err := e.checkAttn(q, kcache, vcache, false, scale)
	if err != nil {
		return err
	}
	if s.d > attnMaxD {
		return errAttnWide("decode")
	}
	if s.tq != 1 || s.tk < 1 {
		return fmt.Errorf("%w: attention decode q %v, cache %v (want one query, a cache of at least one step)", tensor.ErrShape, q.Shape, kcache.Shape)
	}
	if err := e.checkView("attention decode o", o, false, []tensor.DType{q.DType}, q.Shape...); err != nil {
		return err
	}
	if err := e.checkPos(pos); err != nil {
		return err
	}
	if s.b*s.h == 0 {
		return nil
	}
	return e.dispatch(func(h *hostImpl) error {
		p, err := attnHostPos(pos, s.tk)
		if err != nil {
			return err
		}
		return h.attnDecode(o, q, kcache, vcache, p, s, scale)
	}, func(c *cudaImpl) error {
		return c.attnDecode(o, q, kcache, vcache, pos, s, scale)
	})
}

// KVWrite stores a step's keys (or values) in a cache at the position pos
// holds: cache[b, pos, h, :] = x[b, 0, h, :] for every b and h. cache
// [B,Tmax,H,D] and x [B,1,H,D] (any strides, last dimension contiguous; x
// is usually a view of the step's qkv) of one dtype (f32 or bf16); pos an
// i32 scalar on the device read when the op runs. A pos outside
// [0, Tmax) writes nothing.
func (e *Engine) KVWrite(cache, x, pos *tensor.Tensor) error {
	if err := e.checkView("kv write cache", cache, false, floatTypes); err != nil {
		return err
	}
	if cache.Rank() != 4 {
		return fmt.Errorf("%w: kv write cache is %v, want [B,Tmax,H,D]", tensor.ErrShape, cache.Shape)
	}
	b, tmax, h, d := cache.Dim(0), cache.Dim(1), cache.Dim(2), cache.Dim(3)
	if err := e.checkView("kv write x", x, false, []tensor.DType{cache.DType}, b, 1, h, d); err != nil {
		return err
	}
	if err := e.checkPos(pos); err != nil {
		return err
	}
	if b*h*d == 0 || tmax == 0 {
		return nil
	}
	return e.dispatch(func(*hostImpl) error {
		ps, err := pos.I32()
		if err != nil {
			return fmt.Errorf("ops: host backend: %w", err)
		}
		p := int(ps[0])
		if p < 0 || p >= tmax {
			return nil
		}
		row, err := cache.Narrow(1, p, 1)
		if err != nil {
			return err
		}
		v, err := x.ReadFloat32()
		if err != nil {
			return err
		}
		return row.WriteFloat32(v)
	}, func(c *cudaImpl) error {
		return c.attnKVWrite(cache, x, pos)
	})
}

// checkPos validates a decoding position: an i32 tensor of one element.
func (e *Engine) checkPos(pos *tensor.Tensor) error {
	if err := e.checkView("attention position", pos, true, []tensor.DType{tensor.I32}); err != nil {
		return err
	}
	if pos.Numel() != 1 {
		return fmt.Errorf("%w: attention position %v, want one element", tensor.ErrShape, pos.Shape)
	}
	return nil
}

// ---- host ----

// attnIdx is the row-major offset of [b, t, h, 0] in a [B,T,H,D] tensor.
func attnIdx(s attnShape, t, b, i, h int) int { return ((b*t+i)*s.h + h) * s.d }

// attnParallel runs f(0..n-1) on up to GOMAXPROCS goroutines.
func attnParallel(n int, f func(i int)) {
	workers := min(n, runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := 0; i < n; i++ {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	next := 0
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

func attnDot(a, b []float32) float64 {
	var s float64
	for i, x := range a {
		s += float64(x) * float64(b[i])
	}
	return s
}

// The host computes per (b, h) with materialised scores (it is the
// reference backend, not a memory-bound one): the products through gonum's
// Sgemm on rows of the row-major [B,T,H,D] copies (row stride H·D), the
// softmax in float64.

// attnOff is the offset of row 0 of head h of batch item b in a row-major
// [B,T,H,D] array.
func attnOff(s attnShape, t, b, h int) int { return attnIdx(s, t, b, 0, h) }

// hostAttnForward: S = scale·Q·Kᵀ, P = softmax(S) row by row (lse kept),
// O = P·V.
func (hi *hostImpl) attnForward(o, lse, q, k, v *tensor.Tensor, s attnShape, causal bool, scale float32, drop AttnDropout) error {
	step, err := attnDropStep(drop)
	if err != nil {
		return err
	}
	dscale := dropoutScale(drop.P)
	ins, err := hostIns(q, k, v)
	if err != nil {
		return err
	}
	qs, ks, vs := ins[0], ins[1], ins[2]
	out, commit, err := hostOut(o, false)
	if err != nil {
		return err
	}
	ls, lcommit, err := hostOut(lse, false)
	if err != nil {
		return err
	}
	hd := s.h * s.d
	attnParallel(s.b*s.h, func(bh int) {
		b, h := bh/s.h, bh%s.h
		qo, ko := attnOff(s, s.tq, b, h), attnOff(s, s.tk, b, h)
		p := make([]float32, s.tq*s.tk)
		var keep *attnKeep
		if drop.P > 0 {
			keep = newAttnKeep(drop, step, s, b, h)
		}
		hi.blas.Sgemm(blas.NoTrans, blas.Trans, s.tq, s.tk, s.d, scale, qs[qo:], hd, ks[ko:], hd, 0, p, s.tk)
		for i := 0; i < s.tq; i++ {
			row := p[i*s.tk : (i+1)*s.tk]
			n := s.tk
			if causal {
				n = i + 1
			}
			m := math.Inf(-1)
			for _, x := range row[:n] {
				m = math.Max(m, float64(x))
			}
			var l float64
			for _, x := range row[:n] {
				l += math.Exp(float64(x) - m)
			}
			for j := range row {
				if j < n {
					row[j] = float32(math.Exp(float64(row[j])-m) / l)
				} else {
					row[j] = 0
				}
			}
			if ls != nil {
				ls[(b*s.h+h)*s.tq+i] = float32(m + math.Log(l))
			}
			if drop.P > 0 {
				for j := range row[:n] {
					if keep.keep(i, j) {
						row[j] *= dscale
					} else {
						row[j] = 0
					}
				}
			}
		}
		hi.blas.Sgemm(blas.NoTrans, blas.NoTrans, s.tq, s.d, s.tk, 1, p, s.tk, vs[ko:], hd, 0, out[qo:], hd)
	})
	if err := lcommit(); err != nil {
		return err
	}
	return commit()
}

// hostAttnBackward: P = exp(scale·Q·Kᵀ − lse) (masked), δ_i = do_i·o_i,
// dS = P∘(do·Vᵀ − δ), then dQ = scale·dS·K, dK = scale·dSᵀ·Q, dV = Pᵀ·do
// (with dropout, Z = mask/(1−p): dS = P∘(Z∘(do·Vᵀ) − δ), dV = (P∘Z)ᵀ·do).
func (hi *hostImpl) attnBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, s attnShape, causal bool, scale float32, acc [3]bool, drop AttnDropout) error {
	step, err := attnDropStep(drop)
	if err != nil {
		return err
	}
	dscale := dropoutScale(drop.P)
	ins, err := hostIns(q, k, v, o, do, lse)
	if err != nil {
		return err
	}
	qs, ks, vs, os, dos, ls := ins[0], ins[1], ins[2], ins[3], ins[4], ins[5]
	var outs [3][]float32
	var commits [3]func() error
	for i, t := range []*tensor.Tensor{dq, dk, dv} {
		var err error
		if outs[i], commits[i], err = hostOut(t, acc[i]); err != nil {
			return err
		}
	}
	gq, gk, gv := outs[0], outs[1], outs[2]
	hd := s.h * s.d
	attnParallel(s.b*s.h, func(bh int) {
		b, h := bh/s.h, bh%s.h
		qo, ko := attnOff(s, s.tq, b, h), attnOff(s, s.tk, b, h)
		p := make([]float32, s.tq*s.tk)
		ds := make([]float32, s.tq*s.tk)
		var keep *attnKeep
		if drop.P > 0 {
			keep = newAttnKeep(drop, step, s, b, h)
		}
		if s.tq > 0 {
			hi.blas.Sgemm(blas.NoTrans, blas.Trans, s.tq, s.tk, s.d, scale, qs[qo:], hd, ks[ko:], hd, 0, p, s.tk)
			hi.blas.Sgemm(blas.NoTrans, blas.Trans, s.tq, s.tk, s.d, 1, dos[qo:], hd, vs[ko:], hd, 0, ds, s.tk)
		}
		for i := 0; i < s.tq; i++ {
			lse := float64(ls[(b*s.h+h)*s.tq+i])
			r := qo + i*hd
			delta := float32(attnDot(dos[r:r+s.d], os[r:r+s.d]))
			n := s.tk
			if causal {
				n = i + 1
			}
			prow, drow := p[i*s.tk:(i+1)*s.tk], ds[i*s.tk:(i+1)*s.tk]
			for j := range prow {
				if j >= n {
					prow[j], drow[j] = 0, 0
					continue
				}
				pj := float32(math.Exp(float64(prow[j]) - lse))
				prow[j] = pj
				if keep != nil {
					// Dropout: dV takes P∘Z, dS = P∘(Z∘dP − δ).
					if keep.keep(i, j) {
						prow[j] = pj * dscale
						drow[j] = pj * (drow[j]*dscale - delta)
					} else {
						prow[j] = 0
						drow[j] = pj * -delta
					}
					continue
				}
				drow[j] = pj * (drow[j] - delta)
			}
		}
		if gq != nil && s.tq > 0 {
			hi.blas.Sgemm(blas.NoTrans, blas.NoTrans, s.tq, s.d, s.tk, scale, ds, s.tk, ks[ko:], hd, 0, gq[qo:], hd)
		}
		for _, c := range []struct {
			g   []float32
			a   []float32
			x   []float32
			mul float32
		}{{gk, ds, qs, scale}, {gv, p, dos, 1}} {
			if c.g == nil {
				continue
			}
			if s.tq == 0 {
				for j := 0; j < s.tk; j++ {
					clear(c.g[ko+j*hd : ko+j*hd+s.d])
				}
				continue
			}
			hi.blas.Sgemm(blas.Trans, blas.NoTrans, s.tk, s.d, s.tq, c.mul, c.a, s.tk, c.x[qo:], hd, 0, c.g[ko:], hd)
		}
	})
	for _, c := range commits {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

// attnHostPos reads a decoding position and clamps it to [0, tmax−1].
func attnHostPos(pos *tensor.Tensor, tmax int) (int, error) {
	ps, err := pos.I32()
	if err != nil {
		return 0, fmt.Errorf("ops: host backend: %w", err)
	}
	return min(max(int(ps[0]), 0), tmax-1), nil
}

func (hi *hostImpl) attnDecode(o, q, kc, vc *tensor.Tensor, p int, s attnShape, scale float32) error {
	// The cache is read up to row p only: narrow it first, so a long cache
	// costs nothing (and rows past p may hold anything).
	kn, err := kc.Narrow(1, 0, p+1)
	if err != nil {
		return err
	}
	vn, err := vc.Narrow(1, 0, p+1)
	if err != nil {
		return err
	}
	s.tk = p + 1
	return hi.attnForward(o, nil, q, kn, vn, s, false, scale, AttnDropout{})
}

// ---- CUDA ----

// attnArgs is struct attn_args of attention.cu (launch.AttnArgs): the one
// parameter of the forward and backward kernels. Strides are in elements:
// batch, time, head.
type attnArgs launch.AttnArgs

// setDropout fills the dropout fields (the *_drop kernels read them).
func (a *attnArgs) setDropout(d AttnDropout) {
	if d.P == 0 {
		return
	}
	a.DropCounter = devPtr(d.Counter)
	a.DropSeed, a.DropB0, a.DropSite = d.Seed, d.B0, uint32(d.Site)
	a.DropP, a.DropScale = d.P, dropoutScale(d.P)
}

func newAttnArgs(s attnShape, causal bool, scale float32) attnArgs {
	return attnArgs{B: int32(s.b), H: int32(s.h), Tq: int32(s.tq), Tk: int32(s.tk), D: int32(s.d),
		Causal: attnBool(causal), Scale: scale, ScaleLog2: float32(float64(scale) * math.Log2E),
		Group: attnGroup(s)}
}

// attnL2Budget is the bytes of L2 that one group of heads' streamed
// operands may take (attention.cu's attn_block): K and V for the forward
// and dQ, Q and dO for dK/dV. A quarter to a third of an H100's or H200's
// 50 MiB L2, so that the group's tiles stay while the blocks of the next
// group start; 0 keeps the order without groups (the benchmarks' "before").
var attnL2Budget = 16 << 20

// attnGroup is the heads per group of the blocks' launch order: as many
// as keep their two streamed [T, D] bf16 operands within attnL2Budget,
// at least one; 0 (one group, no index arithmetic) without a budget or
// where every head's operands fit in twice the budget (at (64, 6, 256,
// 64) groups cost 6% of the forward+backward, one H200).
func attnGroup(s attnShape) int32 {
	perHead := 2 * max(s.tq, s.tk) * s.d * 2
	if attnL2Budget <= 0 || int64(s.b)*int64(s.h)*int64(perHead) <= 2*int64(attnL2Budget) {
		return 0
	}
	return int32(min(max(attnL2Budget/max(perHead, 1), 1), math.MaxInt32))
}

func (a *attnArgs) setQKV(q, k, v *tensor.Tensor) {
	a.Q, a.Sq = devPtr(q), attnStrides(q)
	a.K, a.Sk = devPtr(k), attnStrides(k)
	a.V, a.Sv = devPtr(v), attnStrides(v)
}

func attnBool(v bool) int32 {
	if v {
		return 1
	}
	return 0
}

// attnStrides are the batch, time and head strides of a [B,T,H,D] view
// (zeros for nil).
func attnStrides(t *tensor.Tensor) [3]int64 {
	if t == nil {
		return [3]int64{}
	}
	return [3]int64{int64(t.Strides[0]), int64(t.Strides[1]), int64(t.Strides[2])}
}

// attnTC reports whether the tensor-core kernels take these tensors: bf16,
// D = 64 or 128, every row 16-byte aligned (attnAligned).
func attnTC(dt tensor.DType, d int, ts ...*tensor.Tensor) bool {
	return dt == tensor.BF16 && (d == 64 || d == 128) && attnAligned(ts...)
}

// attnAligned reports whether every row of ts is 16-byte aligned (cp.async
// and ldmatrix move 16 bytes): base addresses and batch, time and head
// strides multiples of 8 elements (bf16). Nil tensors are skipped.
func attnAligned(ts ...*tensor.Tensor) bool {
	for _, t := range ts {
		if t == nil {
			continue
		}
		if t.Ptr()%16 != 0 {
			return false
		}
		for _, st := range t.Strides[:3] {
			if st%8 != 0 {
				return false
			}
		}
	}
	return true
}

// Launch geometry (attention.cu): 128 threads; the tensor-core kernels work
// on 64-row blocks, the CUDA-core ones own 16 rows and stream 32.
const (
	attnThreads  = 128
	attnTCRows   = 64
	attnSIMTRows = 16
	attnSIMTTile = 32
)

func attnGrid(s attnShape, rows, per int) [3]uint32 {
	return [3]uint32{uint32(s.h), uint32(s.b), uint32((rows + per - 1) / per)}
}

// attnTCTile is the bytes of one padded 64-row bf16 tile.
func attnTCTile(d int) uint32 { return uint32(attnTCRows * (d + 8) * 2) }

// attnFwdWide launches the forward at head dimension attnWideD:
// attn_fwd_ws_d256 (attnWS: key tiles of 64) where attnWide is on, the
// tensors are bf16 and aligned (attnAligned), there is no dropout and the
// device runs the wgmma kernels; else errAttnWide.
func (c *cudaImpl) attnFwdWide(a *attnArgs, s attnShape, dt tensor.DType, ts ...*tensor.Tensor) error {
	if !attnWide || dt != tensor.BF16 || a.DropP > 0 || !attnAligned(ts...) || !c.attnHopper() {
		return errAttnWide("forward")
	}
	w := attnWSFor(false, s.d, max(s.tq, s.tk))
	return launch.AttnFwdWs(c, w.inst(), attnGrid(s, s.tq, w.rows()), block1(w.threads()), w.smem(), a.k())
}

// attnFwdTC launches the tensor-core forward: where attnWG says so, on
// wgmma, attn_fwd_ws_* (attnWSOn, attnWSFor) or
// attn_fwd_wg[_drop]_d{64,128}; else attn_fwd_tc[_drop]_d{64,128}
// (mma.sync) with 4 K/V tiles of shared memory.
func (c *cudaImpl) attnFwdTC(a *attnArgs, s attnShape) error {
	if c.attnWG(s) {
		if drop := a.DropP > 0; attnWSOn(drop) {
			w := attnWSFor(drop, s.d, max(s.tq, s.tk))
			grid := attnGrid(s, s.tq, w.rows())
			if w.persist {
				grid = attnPersistentGrid(grid, c.SMCount())
			}
			return launch.AttnFwdWs(c, w.inst(), grid, block1(w.threads()), w.smem(), a.k())
		}
		return launch.AttnFwdWg(c, a.inst(attnD(s.d)), attnGrid(s, s.tq, attnWGRows), block1(attnWGThreads), attnWGSmem(s.d), a.k())
	}
	return launch.AttnFwdTc(c, a.inst(attnD(s.d)), attnGrid(s, s.tq, attnTCRows),
		block1(attnThreads), 4*attnTCTile(s.d), a.k())
}

// The Hopper (sm_90a) forward, attn_fwd_wg_d{64,128}: 256 threads (two
// warpgroups), 128 query rows per block, key tiles of 128; shared memory
// Q, two K and two V tiles of 128 rows, 128-byte swizzled, from a
// 1024-byte boundary (1 KiB of slack).
const (
	attnWGThreads = 256
	attnWGRows    = 128
)

func attnWGSmem(d int) uint32 { return uint32(5*attnWGRows*d*2 + 1024) }

// attnWS is an instance of the warp-specialised Hopper forward,
// attn_fwd_ws_*: a producer warpgroup copying Q and a two-stage ring of K
// and V tiles (mbarrier completion) and nc consumer warpgroups of 64
// query rows taking turns (2; 3 at D = 64: attn_fwd_ws_c3*), persistent
// or not, dropping or not.
type attnWS struct {
	d, nc         int
	persist, drop bool
}

// attnWSOn reports whether the forward takes attn_fwd_ws where it runs on
// wgmma: attnWGMode 1 (the default), 3, 5 and 6, with dropout or without
// (attn_fwd_ws_drop_d*: one H200, 2026-11-29, 0.88–0.92× the time of
// attn_fwd_wg_drop at D = 128, 0.93–0.97× at D = 64 from T = 1024), and 4
// without.
func attnWSOn(drop bool) bool {
	return attnWGMode == 1 || attnWGMode == 3 || attnWGMode >= 5 || attnWGMode == 4 && !drop
}

// attnWSFor is the attn_fwd_ws instance the forward at head dimension d
// and sequence length t (the longer of Tq and Tk) runs where
// attnWSOn(drop). Never persistent nor three consumers with dropout.
// In attnWGMode 1 (the default): at D = 64 three consumers
// (attn_fwd_ws_c3_d64) from attnC3MinT positions on, persistent below
// (one H200, 2026-11-29: c3 0.95× the persistent kernel's time at causal
// (8,32,2048,64) and 0.84× at non-causal, 1.15× at causal
// (32,12,1024,64), 1.3–1.6× at (64,6,256,64); the persistent kernel
// 0.91–0.97× the non-persistent one at causal T = 1024 and 2048); at
// D = 128 two consumers, not persistent (persistent was 1.17× at causal
// (8,16,2048,128) and 1.35–1.38× at (2,16,8192,128)). Mode 4: persistent
// at both; 5: three consumers at D = 64; 6: as 5, persistent (the
// persistent three-consumer kernel spills 21 words and was 1.08–1.19× the
// non-persistent one's time from T = 1024, 0.90–0.95× at T = 256).
func attnWSFor(drop bool, d, t int) attnWS {
	c3 := !drop && d == 64 && (attnWGMode >= 5 || attnWGMode == 1 && t >= attnC3MinT)
	w := attnWS{d: d, nc: 2, drop: drop}
	if c3 {
		w.nc = 3
	}
	w.persist = !drop && d != attnWideD && (attnWGMode == 4 || attnWGMode == 1 && d == 64 && !c3 || attnWGMode == 6 && c3)
	return w
}

// attnC3MinT is the sequence length from which D = 64 takes the
// three-consumer forward in attnWGMode 1.
const attnC3MinT = 2048

// inst is w's instance name: "[c3_][pers_|drop_]d<D>".
func (w attnWS) inst() string {
	n := attnD(w.d)
	switch {
	case w.persist:
		n = "pers_" + n
	case w.drop:
		n = "drop_" + n
	}
	if w.nc == 3 {
		n = "c3_" + n
	}
	return n
}

// rows is the query rows of one of w's tiles; threads its block size.
func (w attnWS) rows() int    { return 64 * w.nc }
func (w attnWS) threads() int { return 128 * (w.nc + 1) }

// smem is w's dynamic shared memory: Q's tile and two K and two V tiles of
// w.keys() keys from a 1024-byte boundary (1 KiB of slack), then its 10
// mbarriers (80 bytes, 128 reserved).
func (w attnWS) smem() uint32 { return uint32((w.rows()+4*w.keys())*w.d*2 + 1024 + 128) }

// keys is the rows of one of w's K and V tiles: attnWGRows, 64 at
// D = attnWideD (attn_fwd_ws_d256).
func (w attnWS) keys() int {
	if w.d == attnWideD {
		return 64
	}
	return attnWGRows
}

// attnPersistentGrid is the grid of a persistent kernel for the logical
// grid g: one block per multiprocessor (sms), fewer when there are fewer
// tiles; the kernel walks the tiles itself (attn_ws_tile).
func attnPersistentGrid(g [3]uint32, sms int) [3]uint32 {
	n := uint64(g[0]) * uint64(g[1]) * uint64(g[2])
	return [3]uint32{uint32(min(n, uint64(max(sms, 1)))), 1, 1}
}

// attnWGMode says which head dimensions take the wgmma kernels (forward
// and backward) on sm_90a, and which wgmma forward runs:
// 0 none (mma.sync everywhere);
// 1 D = 128, and D = 64 from attnWG64MinT positions on (short sequences
// favour the mma.sync kernel's smaller blocks), the forward on
// attn_fwd_ws, at D = 64 without dropout persistent or with three
// consumers (attnWSFor) —
// the default (one H200,
// 2026-11-29: attn_fwd_ws 0.87× the time of attn_fwd_wg as of bdfc5f8
// at causal (8,16,2048,128), 0.82× at (2,16,8192,128), 0.87–0.94× at
// D = 64);
// 2 both everywhere, the forward on attn_fwd_wg;
// 3 both everywhere, the forward on attn_fwd_ws, never persistent;
// 4 both everywhere, the forward on attn_fwd_ws persistent where there is
// no dropout (attnWSFor);
// 5 both everywhere, the forward on attn_fwd_ws with three consumer
// warpgroups at D = 64 without dropout (attn_fwd_ws_c3_d64);
// 6 as 5, persistent at D = 64 (attn_fwd_ws_c3_pers_d64).
// Tests and benchmarks change it to compare the paths.
var attnWGMode = 1

// attnWG64MinT is the sequence length (the longer of Tq and Tk) from
// which D = 64 takes the wgmma kernels in mode 1.
const attnWG64MinT = 1024

// attnWGState caches whether the device runs the wgmma kernels.
type attnWGState struct{ wgModule }

// attnHopper reports whether attention.cu was compiled with its wgmma
// code (wgModule.has, decided once per engine).
func (c *cudaImpl) attnHopper() bool {
	return exec.StateOf[attnWGState](c.CUDA).has(c, attnWGMarker)
}

// attnWGMarker is the kernel attention.cu defines when it was compiled
// without its wgmma code.
var attnWGMarker = launch.AttnWgUnavailableKernel

// attnWGOn reports whether attnWGMode gives head dimension d at sequence
// length t (the longer of Tq and Tk) the wgmma kernels (on a device that
// has them); attnWide gives them D = attnWideD.
func attnWGOn(d, t int) bool {
	return (d == attnWideD && attnWide) || (d == 128 && attnWGMode >= 1) || (d == 64 && (attnWGMode >= 2 || attnWGMode == 1 && t >= attnWG64MinT))
}

// attnWG reports whether attention of shape s runs on wgmma.
func (c *cudaImpl) attnWG(s attnShape) bool { return attnWGOn(s.d, max(s.tq, s.tk)) && c.attnHopper() }

// inst is the instance of a's kernel template for tail (the head
// dimension "d64", or the dtype "f32"): with "drop_" before it when a
// drops (attn_fwd_tc_drop_d64, attn_fwd_simt_drop_bf16).
func (a *attnArgs) inst(tail string) string {
	if a.DropP > 0 {
		return "drop_" + tail
	}
	return tail
}

// k is a as the kernels' argument.
func (a *attnArgs) k() *launch.AttnArgs { return (*launch.AttnArgs)(a) }

// attnD is the head-dimension part of a tensor-core kernel's instance.
func attnD(d int) string { return "d" + strconv.Itoa(d) }

// attnKernels are the attention.cu kernels attention over dt at head
// dimension d and sequence length t (the longer of Tq and Tk) launches
// (drop: with dropout), its tensors aligned as a Graph's are: the forward,
// and with backward the δ, dK/dV and dQ kernels (at D = attnWideD the
// forward alone); wg says the wgmma path is expected (attnWGOn on sm_90a).
func attnKernels(dt tensor.DType, d, t int, drop, wg, backward bool) []launch.Kernel {
	if d == attnWideD { // a forward only (attnFwdWide)
		if dt != tensor.BF16 || drop || !wg {
			return nil
		}
		k, err := launch.AttnFwdWsKernel(attnWSFor(false, d, t).inst())
		if err != nil {
			return nil
		}
		return []launch.Kernel{k, attnWGMarker}
	}
	a := attnArgs{}
	if drop {
		a.DropP = 1
	}
	tc := attnTC(dt, d)
	named := []func(string) (launch.Kernel, error){launch.AttnFwdSimtKernel, launch.AttnBwdDkdvSimtKernel, launch.AttnBwdDqSimtKernel}
	inst := a.inst(dtName(dt))
	switch {
	case tc && wg:
		named, inst = []func(string) (launch.Kernel, error){launch.AttnFwdWgKernel, launch.AttnBwdDkdvWgKernel, launch.AttnBwdDqWgKernel}, a.inst(attnD(d))
		if attnWSOn(drop) {
			named[0] = func(string) (launch.Kernel, error) { return launch.AttnFwdWsKernel(attnWSFor(drop, d, t).inst()) }
		}
		if attnBwdWSOn(drop, d, true) {
			named[1] = launch.AttnBwdDkdvWsKernel
		}
		if attnBwdWSOn(drop, d, false) {
			named[2] = launch.AttnBwdDqWsKernel
		}
	case tc:
		named, inst = []func(string) (launch.Kernel, error){launch.AttnFwdTcKernel, launch.AttnBwdDkdvTcKernel, launch.AttnBwdDqTcKernel}, a.inst(attnD(d))
	}
	if !backward {
		named = named[:1]
	}
	var ks []launch.Kernel
	for _, f := range named {
		if k, err := f(inst); err == nil {
			ks = append(ks, k)
		}
	}
	if backward {
		delta := launch.AttnBwdDeltaKernel
		if attnDeltaLanes(dt, d) > 0 {
			delta = launch.AttnBwdDeltaVKernel
		}
		if k, err := delta(dtName(dt)); err == nil {
			ks = append(ks, k)
		}
	}
	if tc && wg {
		ks = append(ks, attnWGMarker) // attnHopper's probe
	}
	return ks
}

// prefetchAttention queues attnKernels for head dimension d and sequence
// length t on the CUDA backend (prefetch.go), the backward's too in a
// training graph.
func (g *Graph) prefetchAttention(dt tensor.DType, d, t int, drop bool) {
	c := g.e.c
	if c == nil || g.shared.err != nil {
		return
	}
	kc, err := c.Compiler()
	if err != nil {
		return
	}
	for _, k := range attnKernels(dt, d, t, drop, attnWGOn(d, t) && kc.Arch() == "sm_90a", g.opts.Train) {
		kc.Prefetch(k.File, k.Name)
	}
}

// attnFwdSIMT launches attn_fwd_simt_<dt>: Q [16][D], K [32][D+1], V [32][D] f32.
func (c *cudaImpl) attnFwdSIMT(a *attnArgs, s attnShape, dt tensor.DType) error {
	smem := 4 * (attnSIMTRows*s.d + attnSIMTTile*(s.d+1) + attnSIMTTile*s.d)
	return launch.AttnFwdSimt(c, a.inst(dtName(dt)), attnGrid(s, s.tq, attnSIMTRows),
		block1(attnThreads), uint32(smem), a.k())
}

// attnBwdDelta launches attn_bwd_delta_v_<dt> where o and dO allow it
// (attnDeltaLanes): L lanes per (b, i, h) row, each thread two rows' 16-byte
// vectors per round; else attn_bwd_delta_<dt>, one warp per row.
func (c *cudaImpl) attnBwdDelta(a *attnArgs, s attnShape, dt tensor.DType, o, do *tensor.Tensor) error {
	rows := s.b * s.tq * s.h
	if l := attnDeltaLanes(dt, s.d, o, do); l > 0 && int64(rows)*int64(l) < math.MaxInt32 {
		threads := (rows*l + 1) / 2
		return launch.AttnBwdDeltaV(c, dtName(dt), gridFor(int64(threads), 256),
			block1(256), 0, a.k())
	}
	return launch.AttnBwdDelta(c, dtName(dt), grid1(min((rows+3)/4, 65535)),
		block1(attnThreads), 0, a.k())
}

// attnDeltaLanes is the lanes per row of attn_bwd_delta_v for rows of d
// elements of dt in ts: d/V with V = 16/size(dt) elements per 16-byte
// vector, when that is a power of two ≤ 32 and every base address and
// batch, time and head stride is a multiple of V elements; else 0.
func attnDeltaLanes(dt tensor.DType, d int, ts ...*tensor.Tensor) int {
	v := 16 / dt.Size()
	if d%v != 0 {
		return 0
	}
	l := d / v
	if l > 32 || l&(l-1) != 0 {
		return 0
	}
	for _, t := range ts {
		if t.Ptr()%16 != 0 {
			return 0
		}
		for _, st := range t.Strides[:3] {
			if st%v != 0 {
				return 0
			}
		}
	}
	return l
}

// attnBwdDKDVTC launches attn_bwd_dkdv_wg_d{64,128} (wgmma, 128-key
// blocks: K and V, 3 stages of 64-query Q and dO tiles and of lse and δ)
// where attnWG says so — attn_bwd_dkdv_ws_d{64,128} where attnBwdWSOn (a
// producer warpgroup and three stages, 384 threads; D = 64 by default) —
// else attn_bwd_dkdv_tc_d{64,128} (mma.sync: K, V, 2 Q and 2 dO tiles, and
// 2 × 64 lse and δ values).
func (c *cudaImpl) attnBwdDKDVTC(a *attnArgs, s attnShape) error {
	if c.attnWG(s) {
		if attnBwdWSOn(a.DropP > 0, s.d, true) {
			return launch.AttnBwdDkdvWs(c, a.inst(attnD(s.d)), attnGrid(s, s.tk, attnWGRows), block1(attnBwdWSThreads), attnBwdWSSmem(s.d), a.k())
		}
		smem := uint32(2*attnWGRows*s.d*2 + 6*64*s.d*2 + 6*64*4 + 1024)
		return launch.AttnBwdDkdvWg(c, a.inst(attnD(s.d)), attnGrid(s, s.tk, attnWGRows),
			block1(attnWGThreads), smem, a.k())
	}
	return launch.AttnBwdDkdvTc(c, a.inst(attnD(s.d)), attnGrid(s, s.tk, attnTCRows),
		block1(attnThreads), 6*attnTCTile(s.d)+4*attnTCRows*4, a.k())
}

// attnBwdWSMode says which of the backward's passes run warp-specialised
// (attn_bwd_dkdv_ws, attn_bwd_dq_ws; with dropout only where
// attnBwdWSDrop) where they run on wgmma: 0 neither; 1 (the default) the
// dQ pass at both head dimensions, the dK/dV pass at D = 64; 2 both at
// both. (Removed after they were measured on one H200, 2026-11-29: a dK/dV
// pass on 32-query tiles, 1.02–1.05× attn_bwd_dkdv_ws_d128's time, and
// the whole backward at D = 128 in one pass, dQ's parts added across key
// blocks in a fixed order by the consumers or by a writer warpgroup, 1.5–1.7×
// and 2.1–2.2× the two passes' time, and 1.30–1.45× with its ordering taken
// out: BENCHMARKS.md, bench/notes/attention.md.) One H200, 2026-11-29,
// against
// attn_bwd_*_wg in the same run: attn_bwd_dq_ws 0.77–0.85× the time at
// (8,16,2048,128), (8,32,2048,64) and (2,16,8192,128), causal and not;
// attn_bwd_dkdv_ws 0.85–0.88× at D = 64 from T = 1024 (three stages) but
// 1.04–1.07× at D = 128, where its consumers hold dK, dV, Sᵀ and dPᵀ in 240
// registers (two stages timed the same there: not the producer's lead).
// Tests and benchmarks change it (SetAttentionBwdWS).
var attnBwdWSMode = 1

// attnBwdWSDrop lets a backward with dropout take the warp-specialised
// kernels as attnBwdWSMode says (attn_bwd_*_ws_drop_d*). On: forward and
// backward with p = 0.1 took 0.95–0.98× the time of the wgmma kernels'
// from T = 1024 (one H200, 2026-11-29,
// BenchmarkAttentionForwardBackwardDropout); tests turn it off
// (SetAttentionBwdWSDrop).
var attnBwdWSDrop = true

// attnBwdWSOn reports whether the backward's dK/dV pass (dkdv) or dQ pass
// at head dimension d, dropping or not, takes the warp-specialised kernel.
func attnBwdWSOn(drop bool, d int, dkdv bool) bool {
	switch {
	case drop && !attnBwdWSDrop || attnBwdWSMode == 0:
		return false
	case attnBwdWSMode == 2:
		return true
	}
	return !dkdv || d == 64
}

// The warp-specialised backward's block: a producer and two consumer
// warpgroups.
const attnBwdWSThreads = 384

// attnBwdWSSmem is attn_bwd_dkdv_ws's shared memory: K and V [128][D], three
// stages of Q and dO [64][D] and of lse and δ [64] f32 from a 1024-byte
// boundary, then 7 mbarriers (56 bytes, 64 reserved).
func attnBwdWSSmem(d int) uint32 { return uint32(2*attnWGRows*d*2 + 6*64*d*2 + 6*64*4 + 1024 + 64) }

// attnBwdWSSmemDQ is attn_bwd_dq_ws's: Q and dO [128][D], three stages of
// K and V [64][D] from a 1024-byte boundary, then 7 mbarriers (56 bytes,
// 64 reserved).
func attnBwdWSSmemDQ(d int) uint32 { return uint32(2*attnWGRows*d*2 + 6*64*d*2 + 1024 + 64) }

// attnBwdDQTC launches attn_bwd_dq_wg_d{64,128} (wgmma, 128-query blocks: Q,
// dO, 3 stages of 64-key K and V tiles) where attnWG says so —
// attn_bwd_dq_ws_d{64,128} where attnBwdWSOn (a producer warpgroup and
// three stages; the default without dropout) —, else
// attn_bwd_dq_tc_d{64,128} (mma.sync: Q, dO, 2 K and 2 V tiles).
func (c *cudaImpl) attnBwdDQTC(a *attnArgs, s attnShape) error {
	if c.attnWG(s) {
		if attnBwdWSOn(a.DropP > 0, s.d, false) {
			return launch.AttnBwdDqWs(c, a.inst(attnD(s.d)), attnGrid(s, s.tq, attnWGRows), block1(attnBwdWSThreads), attnBwdWSSmemDQ(s.d), a.k())
		}
		smem := uint32(2*attnWGRows*s.d*2 + 6*64*s.d*2 + 1024)
		return launch.AttnBwdDqWg(c, a.inst(attnD(s.d)), attnGrid(s, s.tq, attnWGRows),
			block1(attnWGThreads), smem, a.k())
	}
	return launch.AttnBwdDqTc(c, a.inst(attnD(s.d)), attnGrid(s, s.tq, attnTCRows),
		block1(attnThreads), 6*attnTCTile(s.d), a.k())
}

// attnBwdDKDVSIMT launches attn_bwd_dkdv_simt_<dt>: K, V [16][D], Q, dO
// [32][D+1], lse and δ [32] f32.
func (c *cudaImpl) attnBwdDKDVSIMT(a *attnArgs, s attnShape, dt tensor.DType) error {
	smem := 4 * (2*attnSIMTRows*s.d + 2*attnSIMTTile*(s.d+1) + 2*attnSIMTTile)
	return launch.AttnBwdDkdvSimt(c, a.inst(dtName(dt)), attnGrid(s, s.tk, attnSIMTRows),
		block1(attnThreads), uint32(smem), a.k())
}

// attnBwdDQSIMT launches attn_bwd_dq_simt_<dt>: Q, dO [16][D], K, V [32][D+1] f32.
func (c *cudaImpl) attnBwdDQSIMT(a *attnArgs, s attnShape, dt tensor.DType) error {
	smem := 4 * (2*attnSIMTRows*s.d + 2*attnSIMTTile*(s.d+1))
	return launch.AttnBwdDqSimt(c, a.inst(dtName(dt)), attnGrid(s, s.tq, attnSIMTRows),
		block1(attnThreads), uint32(smem), a.k())
}

// attnDecode launches attn_decode_<dt>: grid (H, B), 4 warps.
func (c *cudaImpl) attnDecode(o, q, kc, vc, pos *tensor.Tensor, s attnShape, scale float32) error {
	// The batch, time and head strides of q, kcache, vcache and o.
	var st launch.AttnDecStrides
	for i, t := range []*tensor.Tensor{q, kc, vc, o} {
		ts := attnStrides(t)
		copy(st.S[3*i:], ts[:])
	}
	return launch.AttnDecode(c, dtName(q.DType), [3]uint32{uint32(s.h), uint32(s.b), 1},
		block1(attnThreads), 0, devPtr(o), devPtr(q), devPtr(kc), devPtr(vc), devPtr(pos), &st,
		int32(s.tk), int32(s.d), float32(float64(scale)*math.Log2E))
}

// attnKVWrite launches attn_kv_write_<dt> over B·H·D elements.
func (c *cudaImpl) attnKVWrite(cache, x, pos *tensor.Tensor) error {
	b, tmax, h, d := cache.Dim(0), cache.Dim(1), cache.Dim(2), cache.Dim(3)
	n := b * h * d
	return launch.AttnKvWrite(c, dtName(cache.DType), grid1(min((n+255)/256, 65535)), block1(256), 0,
		devPtr(cache), devPtr(x), devPtr(pos), int32(b), int32(h), int32(d), int32(tmax), int64(cache.Strides[0]), int64(cache.Strides[1]), int64(cache.Strides[2]), int64(x.Strides[0]), int64(x.Strides[2]))
}

// ---- graph ----

// SelfAttention records multi-head self-attention over a fused projection
// qkv [B,T,3C] (nanoGPT's c_attn output: q, k, v side by side along the
// last dimension, each [B,T,H,D] row-major within, C = heads·D), with
// scale 1/√D: y [B,T,C] (= [B,T,H,D] contiguous, what the output
// projection reads with no transpose), in qkv's dtype. causal masks later
// positions. The backward writes dq, dk, dv into the views of qkv's
// gradient (accumulating on fan-out). dropout is the probability of
// dropout on the attention weights (nanoGPT's attn_dropout, AttnDropout)
// in training (GraphOptions.Train): the graph's Seed and Counter, the next
// call-site, and batch rows numbered from Shard × B as Graph.Dropout
// numbers them; outside training or with dropout 0 there is none (and no
// call-site is taken).
func (g *Graph) SelfAttention(qkv *Var, heads int, causal bool, dropout float32) *Var {
	if !g.ok(qkv) {
		return nil
	}
	if !(dropout >= 0 && dropout <= 1) {
		g.Fail("attention", fmt.Errorf("%w: attention dropout probability %v", ErrConfig, dropout))
		return nil
	}
	if g.opts.Shard < 0 {
		g.Fail("attention", fmt.Errorf("%w: shard %d", ErrConfig, g.opts.Shard))
		return nil
	}
	x := qkv.Value
	if x.Rank() != 3 || heads <= 0 || x.Dim(2)%(3*heads) != 0 || x.Dim(2) == 0 {
		g.Fail("attention", fmt.Errorf("%w: qkv %v with %d heads (want [B,T,3·heads·D])", tensor.ErrShape, x.Shape, heads))
		return nil
	}
	b, t, d := x.Dim(0), x.Dim(1), x.Dim(2)/(3*heads)
	split := func(v *tensor.Tensor) (q, k, vv *tensor.Tensor, err error) {
		v5, err := v.View(b, t, 3, heads, d)
		if err != nil {
			return nil, nil, nil, err
		}
		parts := make([]*tensor.Tensor, 3)
		for i := range parts {
			if parts[i], err = v5.Select(2, i); err != nil {
				return nil, nil, nil, err
			}
		}
		return parts[0], parts[1], parts[2], nil
	}
	q, k, v, err := split(x)
	if err != nil {
		g.Fail("attention", err)
		return nil
	}
	y := g.NewOut("attention", x.DType, b, t, heads*d)
	lse := g.NewOut("attention.lse", tensor.F32, b, heads, t)
	if !g.ok(y, lse) {
		return nil
	}
	y4, err := y.Value.View(b, t, heads, d)
	if err != nil {
		g.Fail("attention", err)
		return nil
	}
	scale := float32(1 / math.Sqrt(float64(d)))
	var drop AttnDropout
	if g.opts.Train && dropout > 0 {
		drop = AttnDropout{P: dropout, Seed: g.opts.Seed, Site: g.nextSite(), Counter: g.opts.Counter,
			B0: int64(g.opts.Shard) * int64(b)}
	}
	g.prefetchAttention(x.DType, d, t, drop.P > 0)
	e := g.e
	g.Record("attention", []*Var{qkv}, []*Var{y, lse}, func(*Grads) error {
		return e.AttentionForward(y4, lse.Value, q, k, v, causal, scale, drop)
	}, func(gr *Grads) error {
		dy, dx := gr.Out(0), gr.In(0)
		if dy == nil || dx == nil {
			return nil
		}
		dy4, err := dy.View(b, t, heads, d)
		if err != nil {
			return err
		}
		dq, dk, dv, err := split(dx)
		if err != nil {
			return err
		}
		acc := gr.Acc(0)
		return e.AttentionBackward(dq, dk, dv, dy4, q, k, v, y4, lse.Value, causal, scale, [3]bool{acc, acc, acc}, drop)
	})
	return y
}
