package optim

import (
	"fmt"
	"slices"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// SOAPConfig configures SOAP (Vyas et al. 2024, "SOAP: Improving and
// stabilizing Shampoo using Adam", Algorithm 1): Adam run in the
// eigenbasis of Shampoo's preconditioner, the basis refreshed every
// UpdateFreq steps. For a matrix parameter W split into blocks of at most
// MaxBlock (ops.Blocking), per block G at step t:
//
//	L ← βs·L + (1−βs)·G·Gᵀ,  R ← βs·R + (1−βs)·Gᵀ·G
//	at t = 1: Q_L, Q_R = eigenvectors of L, R (rows)
//	at t = 1+k, 1+2k, ...: Q_L, Q_R refreshed by one step of power
//	    iteration and QR (ops.SOAPBasis), V permuted to follow (below)
//	M ← β1·M + (1−β1)·G                        (in the original coordinates)
//	G' = Q_L·G·Q_Rᵀ,  M' = Q_L·M·Q_Rᵀ           (into the eigenbasis)
//	    (M' is kept: M' ← β1·M' + (1−β1)·G' while the basis stays, and
//	    rotated from M only when a basis is put in use, as NVIDIA's
//	    Emerging-Optimizers' update_eigenbasis_and_momentum keeps the
//	    momentum in the eigenbasis: two GEMMs a block fewer per step)
//	V ← β2·V + (1−β2)·G'²                      (in the eigenbasis)
//	N = Q_Lᵀ·(M'/(√V + ε))·Q_R                 (back)
//	W ← W − LR·(√(1−β2ᵗ)/(1−β1ᵗ)·N + WeightDecay·W)
//
// The statistics take step t's gradient before the basis of step t is
// refreshed. Step 1, as in the reference code, only gathers statistics
// and computes the first basis: its gradient's rotation is exactly
// diagonal in that basis, and the rounding noise off the diagonal,
// divided by a second moment of the same size, would be an O(1) step in
// directions the gradient does not have. Updates start at step 2 and t in
// the bias corrections counts them (t = step − 1). Vectors, and parameters
// whose name contains one of AdamOnly, take AdamW (ops.AdamW) with LR,
// β1, β2, ε and WeightDecay. With asynchronous bases the eigenbasis in use
// is MaxStaleness steps old (identities before the first); its second
// moment V is kept across refreshes, as in the reference code.
//
// Refreshes after the first follow the paper (§"Efficiency") and the
// reference code (get_orthogonal_matrix_QR) rather than decomposing
// again: with the basis Q in use (rows q_i) and the statistics S, the
// estimated eigenvalues e_i = q_i·S·q_iᵀ order the rows, the rows S·q_i
// are orthonormalised in descending order of e_i (one step of subspace
// iteration, which converges to S's eigenvectors over refreshes while S
// changes slowly), and V, which lives in the basis, is permuted along
// each dimension with its basis's rows (ops.SOAPPermute), so that every
// second-moment entry stays with the direction it was accumulated for.
// Rows are kept in ascending order of e_i (the reference sorts
// descending; the order of a basis is immaterial once V follows it, and
// ascending keeps PadDiag's padded coordinates last, as SOAPAdam
// expects). One refresh costs two products and a QR per block instead of
// an eigendecomposition. EighRefresh decomposes at every refresh instead
// (the behaviour before; V then is not permuted).
type SOAPConfig struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	// ShampooBeta is βs, the statistics' decay (0: Beta2).
	ShampooBeta float32
	MaxBlock    int
	UpdateFreq  int
	// Roots: Async and MaxStaleness (the basis is always an
	// eigenbasis: Method is ignored).
	Roots    RootOptions
	AdamOnly []string
	// EighRefresh recomputes the bases by eigendecomposition at every
	// refresh instead of by power iteration and QR after the first.
	EighRefresh bool
}

// DefaultSOAP is the reference implementation's default (lr 3e-3, betas
// (0.95, 0.95), shampoo_beta = β2, eps 1e-8, weight decay 0.01,
// precondition_frequency 10) with blocks of at most 1024.
var DefaultSOAP = SOAPConfig{LR: 3e-3, Beta1: 0.95, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.01, MaxBlock: 1024, UpdateFreq: 10}

func (c SOAPConfig) validate() error {
	if !(c.LR >= 0 && c.Beta1 >= 0 && c.Beta1 < 1 && c.Beta2 >= 0 && c.Beta2 < 1 && c.Eps > 0 && c.WeightDecay >= 0 &&
		c.ShampooBeta >= 0 && c.ShampooBeta < 1 && c.MaxBlock >= 1 && c.UpdateFreq >= 1) {
		return fmt.Errorf("%w: SOAP %+v", ErrConfig, c)
	}
	r := c.Roots
	r.Method = ops.RootEigen
	return r.validate(c.UpdateFreq)
}

// soapParam is one matrix parameter's place in SOAP.
type soapParam struct {
	name        string
	p, g        *tensor.Tensor // [M, N] views
	blk         ops.Blocking
	m           *tensor.Tensor // state: first moment [M, N]
	v           *tensor.Tensor // state: second moment in the eigenbasis, blocked
	gs, gm      *tensor.Tensor // work: blocked gradient and first moment
	left, right *statClass
	offL, offR  int
}

// soapGroup is a blockGroup of SOAP's matrix parameters with its blocked
// gradient and first moment.
type soapGroup struct {
	*blockGroup
	gs, gm *tensor.Tensor // work [count, br, bc]
	// mr is the first moment in the eigenbasis, Q_L·M·Q_Rᵀ (state
	// [count, br, bc], zero until step 2): computed from M when a basis
	// is put in use after step 1, else updated as M is, from the rotated
	// gradient.
	mr *tensor.Tensor
}

// soapPerm is a class's permutations of its bases' rows at the last
// power-iteration refresh ([count, d] i32, work), by class.
type soapPerm map[*statClass]*tensor.Tensor

// SOAP is the optimizer of SOAPConfig.
type SOAP struct {
	rooted
	cfg    SOAPConfig
	params []*soapParam
	groups []*soapGroup // the matrix parameters by block shape (members index params)
	cls    []*statClass
	// work shared by parameters: a product, the rotated gradient (reused
	// for the step) and the eigenbasis step.
	t1, gr, nr *tensor.Tensor
	// rotStale: a basis was put in use at this step (sched.use), so the
	// rotated moments are computed from M.
	rotStale bool
	// AdamW for the other parameters.
	adam         []nn.Param
	adamM, adamV []*tensor.Tensor
	adamStep     *tensor.Tensor
	adamP, adamG []*tensor.Tensor
	perm         soapPerm
	// bc holds the previous step's bias corrections ([2] f32, work: left
	// by the device's step counter with lag 1), which give the step's
	// coefficient √(1−β2ᵗ⁻¹)/(1−β1ᵗ⁻¹) on the device (ops.BlockApply.CoefBC).
	bc      *tensor.Tensor
	lrScale *tensor.Tensor // the run's device learning-rate scale, or nil
}

// NewSOAP allocates SOAP's state through a: per matrix parameter
// "<name>.exp_avg" ([M, N]) and "<name>.exp_avg_sq" (blocked, in the
// eigenbasis); per block shape i "soap/group<i>.exp_avg_rotated" (the
// first moments of its blocks in the eigenbasis, stacked); per block order d "soap/d<d>.stats" and "soap/d<d>.basis"
// ([count, d, d], stacked across parameters; bases start as identities),
// and the work "soap/d<d>.perm" ([count, d] i32: the last refresh's
// permutations); per other parameter "<name>.exp_avg", "<name>.exp_avg_sq" and one
// "adamw.step" for AdamW; "step"; with async bases "soap/d<d>.snap0".
func NewSOAP(a device.Allocator, prefix string, params []nn.Param, cfg SOAPConfig) (o *SOAP, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkParams(params); err != nil {
		return nil, err
	}
	if cfg.ShampooBeta == 0 {
		cfg.ShampooBeta = cfg.Beta2
	}
	o = &SOAP{cfg: cfg, rooted: newRooted(rootSched{opts: cfg.Roots, start: 1, every: cfg.UpdateFreq})}
	o.sched.opts.Method = ops.RootEigen
	defer func() {
		if err != nil {
			o.s.free()
			o = nil
		}
	}()
	if err := o.s.init(params); err != nil {
		return o, err
	}
	var blks []ops.Blocking
	for _, p := range params {
		if p.Value.Rank() < 2 || matches(p.Name, cfg.AdamOnly) {
			o.adam = append(o.adam, p)
			continue
		}
		pv, err := matrix2D(p.Value)
		if err != nil {
			return o, err
		}
		gv, _ := matrix2D(p.Grad)
		blk, err := ops.NewBlocking(pv.Dim(0), pv.Dim(1), cfg.MaxBlock)
		if err != nil {
			return o, err
		}
		sp := &soapParam{name: p.Name, p: pv, g: gv, blk: blk}
		if sp.m, err = o.s.zeros(a, prefix, p.Name+".exp_avg", tensor.F32, pv.Shape...); err != nil {
			return o, err
		}
		if sp.v, err = o.s.zeros(a, prefix, p.Name+".exp_avg_sq", tensor.F32, blk.Shape()...); err != nil {
			return o, err
		}
		o.params, blks = append(o.params, sp), append(blks, blk)
	}
	bgs := groupByShape(blks, slices.Repeat([]bool{true}, len(blks)))
	var cs classes
	placeGroups(bgs, &cs)
	maxBlocked := 0
	for i, bg := range bgs {
		g := &soapGroup{blockGroup: bg}
		o.groups = append(o.groups, g)
		maxBlocked = max(maxBlocked, g.count*g.br*g.bc)
		if g.gs, err = o.s.work(a, prefix, fmt.Sprintf("soap/group%d.grad", i), tensor.F32, g.shape()...); err != nil {
			return o, err
		}
		if g.gm, err = o.s.work(a, prefix, fmt.Sprintf("soap/group%d.moment", i), tensor.F32, g.shape()...); err != nil {
			return o, err
		}
		if g.mr, err = o.s.zeros(a, prefix, fmt.Sprintf("soap/group%d.exp_avg_rotated", i), tensor.F32, g.shape()...); err != nil {
			return o, err
		}
		for k, pi := range g.members {
			sp := o.params[pi]
			if sp.gs, err = g.member(g.gs, k); err != nil {
				return o, err
			}
			if sp.gm, err = g.member(g.gm, k); err != nil {
				return o, err
			}
			sp.left, sp.offL = g.left, g.offL+g.offs[k]
			sp.right, sp.offR = g.right, g.offR+g.offs[k]
		}
	}
	o.cls = cs.sorted()
	o.perm = soapPerm{}
	for _, c := range o.cls {
		tag := fmt.Sprintf("soap/d%d", c.d) // "d": blocks stacked by shape (a checkpoint of the per-parameter layout does not load)
		if c.stats, err = o.s.zeros(a, prefix, tag+".stats", tensor.F32, c.count, c.d, c.d); err != nil {
			return o, err
		}
		if c.out, err = o.s.zeros(a, prefix, tag+".basis", tensor.F32, c.count, c.d, c.d); err != nil {
			return o, err
		}
		if err := identity(c.out); err != nil {
			return o, err
		}
		if c.status, err = o.s.work(a, prefix, tag+".status", tensor.I32, c.count); err != nil {
			return o, err
		}
		real, err := o.s.work(a, prefix, tag+".real", tensor.I32, c.count)
		if err != nil {
			return o, err
		}
		if err := real.Write(tensor.AsBytes(c.real)); err != nil {
			return o, err
		}
		eig, err := o.s.work(a, prefix, tag+".padded", tensor.F32, c.count, c.d, c.d)
		if err != nil {
			return o, err
		}
		vals, err := o.s.work(a, prefix, tag+".eigenvalues", tensor.F32, c.count, c.d)
		if err != nil {
			return o, err
		}
		perm, err := o.s.work(a, prefix, tag+".perm", tensor.I32, c.count, c.d)
		if err != nil {
			return o, err
		}
		o.perm[c] = perm
		c := c
		c.job = &rootJob{name: tag, src: []*tensor.Tensor{c.stats}, dst: []*tensor.Tensor{c.out, perm}, stacked: true,
			compute: func(e *ops.Engine, src, dst []*tensor.Tensor, part span, f64, first bool) (*tensor.Tensor, error) {
				s, err := part.ofAll([]*tensor.Tensor{eig, real, vals, c.status})
				if err != nil {
					return nil, err
				}
				eig, real, vals, status := s[0], s[1], s[2], s[3]
				if err := e.Copy(eig, src[0]); err != nil {
					return nil, err
				}
				if err := e.PadDiag(eig, real); err != nil {
					return nil, err
				}
				if first || cfg.EighRefresh {
					return status, e.Eigh(ops.Eigh{A: eig, Q: dst[0], W: vals, F64: f64, Status: status})
				}
				return status, e.SOAPBasis(ops.SOAPBasis{L: eig, Q: dst[0], Perm: dst[1], F64: f64, Status: status})
			}}
		if err := o.sched.add(&o.s, a, prefix, c.job, c.status); err != nil {
			return o, err
		}
	}
	o.sched.use = o.useBases
	for _, p := range o.adam {
		m, err := o.s.zeros(a, prefix, p.Name+".exp_avg", tensor.F32, p.Value.Shape...)
		if err != nil {
			return o, err
		}
		v, err := o.s.zeros(a, prefix, p.Name+".exp_avg_sq", tensor.F32, p.Value.Shape...)
		if err != nil {
			return o, err
		}
		o.adamM, o.adamV = append(o.adamM, m), append(o.adamV, v)
		o.adamP, o.adamG = append(o.adamP, p.Value), append(o.adamG, p.Grad)
	}
	if len(o.adam) > 0 {
		if o.adamStep, err = o.s.zeros(a, prefix, "adamw.step", tensor.I32, 1); err != nil {
			return o, err
		}
	}
	if o.step.dev, err = o.s.zeros(a, prefix, "step", tensor.I32, 1); err != nil {
		return o, err
	}
	if o.bc, err = o.s.work(a, prefix, "soap.bias_correction", tensor.F32, 2); err != nil {
		return o, err
	}
	if maxBlocked > 0 {
		for _, w := range []struct {
			t **tensor.Tensor
			n string
		}{{&o.t1, "soap.tmp"}, {&o.gr, "soap.rotated_grad"}, {&o.nr, "soap.rotated_step"}} {
			if *w.t, err = o.s.work(a, prefix, w.n, tensor.F32, maxBlocked); err != nil {
				return o, err
			}
		}
	}
	return o, nil
}

// Step implements Optimizer: the moments' and statistics' updates of every
// matrix parameter, the bases' schedule (a refresh at t = 1, 1+k, ...,
// synchronously or on the side stream), the steps in the eigenbasis
// (six GEMMs batched over each block shape's parameters — eight where a
// basis was just put in use — the rotated moment's update, and one
// multi-tensor ops.SOAPAdams and ops.BlockApplies per shape, the latter's
// coefficient from the device counter's corrections of t−1), and AdamW
// for the others. Queued on e; steps with no refresh starting or put in
// use may be captured and replayed (Phaser).
func (o *SOAP) Step(e *ops.Engine) error {
	o.e = e
	// On the device (checkpointed, and the GPT's dropout keys on it): a
	// replayed step advances it, and leaves t−1's corrections in o.bc.
	t, err := o.step.advance(e, o.bc, o.cfg.Beta1, o.cfg.Beta2, 1)
	if err != nil {
		return err
	}
	c := o.cfg
	bs := c.ShampooBeta
	for _, g := range o.groups {
		preps := make([]ops.SOAPTensors, len(g.members))
		for k, pi := range g.members {
			sp := o.params[pi]
			preps[k] = ops.SOAPTensors{X: sp.g, Y: sp.m, W: sp.gs, Z: sp.gm, Blk: sp.blk}
		}
		if err := e.SOAPPreps(preps, c.Beta1); err != nil {
			return err
		}
		if t == 1 { // step 1 leaves the moment at zero (see SOAPConfig)
			for _, pi := range g.members {
				if err := e.Fill(o.params[pi].m, 0); err != nil {
					return err
				}
			}
		}
		l, r, err := g.stats()
		if err != nil {
			return err
		}
		if err := e.Matmul(ops.Matmul{A: g.gs, B: g.gs, D: l, TransB: true, Alpha: 1 - bs, Beta: bs, Accumulate: bs > 0}); err != nil {
			return err
		}
		if err := e.Matmul(ops.Matmul{A: g.gs, B: g.gs, D: r, TransA: true, Alpha: 1 - bs, Beta: bs, Accumulate: bs > 0}); err != nil {
			return err
		}
	}
	if err := o.sched.step(e, t); err != nil {
		return err
	}
	if t == 1 {
		o.rotStale = false // M and M' are zero: any basis holds them
		return nil         // statistics and the first basis only (see SOAPConfig)
	}
	for _, g := range o.groups {
		ql, qr, err := g.outs()
		if err != nil {
			return err
		}
		var w [3]*tensor.Tensor
		for i, b := range []*tensor.Tensor{o.t1, o.gr, o.nr} {
			if w[i], err = g.work(b); err != nil {
				return err
			}
		}
		t1, gr, nr, mr := w[0], w[1], w[2], g.mr
		rotate := func(x, out *tensor.Tensor) error { // out = Q_L·x·Q_Rᵀ
			if err := e.Matmul(ops.Matmul{A: ql, B: x, D: t1}); err != nil {
				return err
			}
			return e.Matmul(ops.Matmul{A: t1, B: qr, D: out, TransB: true})
		}
		if err := rotate(g.gs, gr); err != nil {
			return err
		}
		if o.rotStale { // a new basis: M' from M
			if err := rotate(g.gm, mr); err != nil {
				return err
			}
		} else { // M' ← β1·M' + (1−β1)·G', as M is
			if err := e.Scale(mr, mr, c.Beta1, false); err != nil {
				return err
			}
			if err := e.Scale(mr, gr, 1-c.Beta1, true); err != nil {
				return err
			}
		}
		adams := make([]ops.SOAPTensors, len(g.members))
		for k, pi := range g.members {
			var v [3]*tensor.Tensor
			for i, x := range []*tensor.Tensor{gr, mr, nr} {
				if v[i], err = g.member(x, k); err != nil {
					return err
				}
			}
			adams[k] = ops.SOAPTensors{X: v[0], U: v[1], Y: o.params[pi].v, W: v[2], Blk: g.blks[k]}
		}
		if err := e.SOAPAdams(adams, c.Beta2, c.Eps); err != nil {
			return err
		}
		if err := e.Matmul(ops.Matmul{A: ql, B: nr, D: t1, TransA: true}); err != nil {
			return err
		}
		if err := e.Matmul(ops.Matmul{A: t1, B: qr, D: gr}); err != nil {
			return err
		}
		aps := make([]ops.BlockApply, len(g.members))
		for k, pi := range g.members {
			d, err := g.member(gr, k)
			if err != nil {
				return err
			}
			sp := o.params[pi]
			aps[k] = ops.BlockApply{P: sp.p, D: d, Blk: sp.blk, LR: c.LR, Coef: 1, CoefBC: o.bc, Decay: c.WeightDecay,
				LRScale: o.lrScale}
		}
		if err := e.BlockApplies(aps); err != nil {
			return err
		}
	}
	o.rotStale = false
	if len(o.adam) > 0 {
		return e.AdamW(o.adamP, o.adamG, o.adamM, o.adamV, o.adamStep,
			ops.AdamWConfig{LR: c.LR, Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, WeightDecay: c.WeightDecay, LRScale: o.lrScale})
	}
	return nil
}

// SetLRScale makes every later step's learning rate LR·scale[0] (a [1]
// f32 device tensor the run's schedule writes), so that a captured step
// follows the schedule; nil goes back to LR alone.
func (o *SOAP) SetLRScale(scale *tensor.Tensor) { o.lrScale = scale }

// NextPhase implements Phaser: −1 when the next step starts a refresh
// (the first step is one), puts one in use or is the first after
// construction; else 1 (0 before an asynchronous first basis is in use,
// the same work).
func (o *SOAP) NextPhase() int { return o.rooted.nextPhase() }

// Replayed implements Phaser.
func (o *SOAP) Replayed() { o.rooted.replayed() }

// useBases runs when the bases of step t's refresh are put in use
// (sched.use): the rotated first moments are recomputed from M at this
// step, and the second moments follow the bases' permutations
// (permuteMoments; not with EighRefresh, whose bases are decomposed
// afresh).
func (o *SOAP) useBases(e *ops.Engine, t int) error {
	o.rotStale = true
	if o.cfg.EighRefresh {
		return nil
	}
	return o.permuteMoments(e, t)
}

// permuteMoments carries every second moment over to the bases of the
// power-iteration refresh of step t just put in use (sched.use): V's rows
// and columns of each block follow the permutations of its left and right
// bases. The first refresh (an eigendecomposition) permutes nothing.
func (o *SOAP) permuteMoments(e *ops.Engine, t int) error {
	if t == o.sched.start {
		return nil
	}
	for _, sp := range o.params {
		k := sp.blk.Count()
		rows, err := slice(o.perm[sp.left], sp.offL, k)
		if err != nil {
			return err
		}
		cols, err := slice(o.perm[sp.right], sp.offR, k)
		if err != nil {
			return err
		}
		if err := e.SOAPPermute(sp.v, rows, cols, sp.blk); err != nil {
			return err
		}
	}
	return nil
}

// Permutation returns, for the matrix parameter named name, the
// permutations of its blocks' basis rows at the last power-iteration
// refresh put in use: left [Count, BR] and right [Count, BC] i32 (row k of
// a refreshed basis refines row perm[k] of the one before; views of work
// state, meaningful after such a refresh); ok is false for a parameter
// SOAP does not precondition.
func (o *SOAP) Permutation(name string) (left, right *tensor.Tensor, ok bool) {
	for _, sp := range o.params {
		if sp.name == name {
			l, _ := slice(o.perm[sp.left], sp.offL, sp.blk.Count())
			r, _ := slice(o.perm[sp.right], sp.offR, sp.blk.Count())
			return l, r, true
		}
	}
	return nil, nil, false
}

// Basis returns the eigenbases in use for the blocks of the matrix
// parameter named name: left [Count, BR, BR] and right [Count, BC, BC]
// (rows are eigenvectors; views of the stacked state), and its blocking;
// ok is false for a parameter SOAP does not precondition.
func (o *SOAP) Basis(name string) (left, right *tensor.Tensor, blk ops.Blocking, ok bool) {
	for _, sp := range o.params {
		if sp.name == name {
			l, _ := slice(sp.left.out, sp.offL, sp.blk.Count())
			r, _ := slice(sp.right.out, sp.offR, sp.blk.Count())
			return l, r, sp.blk, true
		}
	}
	return nil, nil, ops.Blocking{}, false
}

// State implements Optimizer.
func (o *SOAP) State() []nn.Param { return o.s.state }

// SetLR implements Optimizer.
func (o *SOAP) SetLR(lr float32) { o.cfg.LR = lr }

// Config is the current configuration.
func (o *SOAP) Config() SOAPConfig { return o.cfg }

// Reset, Free, Steps, Counter, RootStats and Capturable come from rooted.

var (
	_ Optimizer = (*SOAP)(nil)
	_ Capturer  = (*SOAP)(nil)
	_ Phaser    = (*SOAP)(nil)
)
