package autograd

import (
	"errors"
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// Errors.
var (
	// ErrNoForward: Backward was called before Forward.
	ErrNoForward = errors.New("autograd: backward before forward")
	// ErrArg: a recorded op is missing a tensor it needs, or a Var belongs
	// to another tape.
	ErrArg = errors.New("autograd: bad argument")
	// ErrBuilt: the tape was changed after Build, or run before it.
	ErrBuilt = errors.New("autograd: tape already built (or not built yet)")
)

// Func is a node's forward or backward step. Grads gives the node's
// gradient tensors; a forward step may ignore it (a loss node that writes
// its inputs' gradients in the forward pass uses it).
type Func func(g *Grads) error

// Var is a value in the graph and, where a gradient flows to it, its
// gradient: a tensor of the value's shape and the dtype the tape chose
// (the value's, or the root's for an alias; see Tape.Alias).
type Var struct {
	Name  string
	Value *tensor.Tensor
	// Grad is the gradient buffer (nil where none flows). Params get
	// theirs from the caller; Build allocates the others.
	Grad *tensor.Tensor

	tape     *Tape
	param    bool
	requires bool // a gradient is wanted (a param, or computed from one)
	producer *node
	// alias: the gradient of this Var is gradOf(alias's gradient);
	// writers of this Var's gradient are writers of the root's.
	alias  *Var
	gradOf func(baseGrad *tensor.Tensor) (*tensor.Tensor, error)
	// writers of this (root) Var's gradient, in backward order.
	writers []writer
}

type writer struct {
	n  *node
	in int
}

// RequiresGrad reports whether a gradient flows to v.
func (v *Var) RequiresGrad() bool { return v.requires }

// IsParam reports whether v was registered with Tape.Param.
func (v *Var) IsParam() bool { return v.param }

// Computed reports whether a recorded node writes v's value (v is an op's
// output, or an alias of one); false for params, inputs and their aliases,
// whose values are set before Forward runs.
func (v *Var) Computed() bool { return v.producer != nil }

func (v *Var) root() *Var {
	for v.alias != nil {
		v = v.alias
	}
	return v
}

type node struct {
	name      string
	in, out   []*Var
	fwd, bwd  Func
	fwdGrads  bool   // the forward writes the inputs' gradients (a fused loss)
	acc       []bool // per input: accumulate into its gradient (else overwrite)
	sole      []bool // per input: this node is the only writer of its gradient
	wantsIn   []bool // per input: its gradient is written by this node
	outNeeded []bool // per output: something downstream writes its gradient
	runBwd    bool
	grads     Grads
	// ready are the params whose gradient this node writes last in
	// backward order (Tape.OnGradReady).
	ready []*Var
}

// Grads is what a node's steps see of the gradients.
type Grads struct{ n *node }

// Out is the gradient of output i, or nil when nothing downstream of it
// has a gradient (treat it as zero).
func (g *Grads) Out(i int) *tensor.Tensor {
	if i < 0 || i >= len(g.n.out) || !g.n.outNeeded[i] {
		return nil
	}
	return g.n.out[i].Grad
}

// In is where the gradient of input i goes, or nil when input i wants
// none (a constant, an index tensor, a value computed from no param).
func (g *Grads) In(i int) *tensor.Tensor {
	if i < 0 || i >= len(g.n.in) || !g.n.wantsIn[i] {
		return nil
	}
	return g.n.in[i].Grad
}

// Sole reports whether this node is the only writer of input i's gradient
// (no fan-out): an op may then write it on a side stream, joined before
// anything reads it, without ordering against other writers.
func (g *Grads) Sole(i int) bool { return i >= 0 && i < len(g.n.in) && g.n.sole[i] }

// Acc reports whether the gradient of input i must be added to what In(i)
// holds (another consumer of the same value wrote first) rather than
// overwrite it. Ops implement both, so fan-out costs no extra pass.
func (g *Grads) Acc(i int) bool { return i >= 0 && i < len(g.n.in) && g.n.acc[i] }

// Tape records a static graph of nodes over buffers allocated once. Record
// every node (Op, Loss), call Build once, then Forward and Backward every
// step: nothing is allocated after Build, which is what lets a CUDA
// backend capture a whole training step as one graph.
//
// Gradients: a Var requires a gradient when it is a Param or an op's
// output with an input that requires one. Build allocates the gradient
// of every such Var that is not a Param (through the tape's allocator,
// named <prefix>/grads/<name>), and decides for each gradient which
// writer comes first in backward order: that one overwrites, the others
// accumulate (Grads.Acc). So a value consumed twice — a residual stream,
// tied weights — gets the sum of its consumers' gradients with no zeroing
// pass. A Param nothing writes to is zero-filled once at Build.
//
// A Tape is not safe for concurrent use.
type Tape struct {
	alloc  device.Allocator
	prefix string
	fill   func(t *tensor.Tensor, v float64) error
	nodes  []*node
	vars   []*Var
	owned  []*tensor.Tensor
	built  bool
	grads  bool
	ranFwd bool
	// onReady is OnGradReady's hook; readyFirst are the params whose
	// gradients are final when Backward starts (no writer, or written by a
	// loss node in the forward).
	onReady    func(v *Var) error
	readyFirst []*Var
}

// New returns an empty tape that allocates through a, naming buffers
// <prefix>/acts/<name> and <prefix>/grads/<name> (no prefix when empty).
// fill sets every element of a tensor to a value (ops.Engine.Fill); Build
// uses it to zero gradients no op writes.
func New(a device.Allocator, prefix string, fill func(t *tensor.Tensor, v float64) error) *Tape {
	return &Tape{alloc: a, prefix: prefix, fill: fill}
}

// Allocator is the tape's allocator.
func (t *Tape) Allocator() device.Allocator { return t.alloc }

func (t *Tape) bufName(kind, name string) string {
	if t.prefix == "" {
		return kind + "/" + name
	}
	return t.prefix + "/" + kind + "/" + name
}

func (t *Tape) newVar(name string, value *tensor.Tensor) *Var {
	v := &Var{Name: name, Value: value, tape: t}
	t.vars = append(t.vars, v)
	return v
}

// Param registers a trainable leaf: value and its gradient grad (same
// shape; f32 master weights have f32 gradients), both owned by the caller.
func (t *Tape) Param(name string, value, grad *tensor.Tensor) *Var {
	v := t.newVar(name, value)
	v.Grad, v.param, v.requires = grad, true, true
	return v
}

// Input registers a leaf that wants no gradient (data, labels, indices).
func (t *Tape) Input(name string, value *tensor.Tensor) *Var { return t.newVar(name, value) }

// Alloc allocates a Var's value buffer (named <prefix>/acts/<name>), to
// be an op's output. The tape frees it in Free.
func (t *Tape) Alloc(name string, dt tensor.DType, shape ...int) (*Var, error) {
	if t.built {
		return nil, ErrBuilt
	}
	x, err := tensor.Alloc(t.alloc, t.bufName("acts", name), dt, shape...)
	if err != nil {
		return nil, fmt.Errorf("autograd: allocating %s: %w", name, err)
	}
	t.owned = append(t.owned, x)
	return t.newVar(name, x), nil
}

// Alias registers value as another form of base whose gradient is
// gradOf(base's gradient): a reshape or permutation of base (gradOf makes
// the same view of the gradient) or a cast (value a bf16 copy that an op
// fills; gradOf returns base's gradient itself, so gradients reach the
// f32 master directly). Writers of the alias's gradient are ordered with
// those of base's root (the Var at the end of the chain of aliases).
func (t *Tape) Alias(name string, base *Var, value *tensor.Tensor, gradOf func(baseGrad *tensor.Tensor) (*tensor.Tensor, error)) (*Var, error) {
	if t.built {
		return nil, ErrBuilt
	}
	if base == nil || base.tape != t {
		return nil, fmt.Errorf("%w: alias %s of a Var of another tape", ErrArg, name)
	}
	v := t.newVar(name, value)
	v.alias, v.gradOf, v.requires = base, gradOf, base.requires
	v.producer = base.root().producer
	return v, nil
}

// Op records a node: fwd computes out from in; bwd (nil when no input can
// want a gradient) reads the outputs' gradients and writes or adds the
// inputs' (see Grads). Every Var must belong to this tape. Outputs require
// a gradient when any input does.
func (t *Tape) Op(name string, in, out []*Var, fwd, bwd Func) error {
	return t.record(name, in, out, fwd, bwd, false)
}

// Loss records a node whose forward computes a scalar loss into out and,
// in the same pass, the gradient of that loss with respect to each input
// that wants one (fused softmax cross-entropy). It is the root of the
// backward pass: its writes come first in gradient order.
func (t *Tape) Loss(name string, in []*Var, out *Var, fwd Func) error {
	return t.record(name, in, []*Var{out}, fwd, nil, true)
}

func (t *Tape) record(name string, in, out []*Var, fwd, bwd Func, fwdGrads bool) error {
	if t.built {
		return ErrBuilt
	}
	for _, v := range append(append([]*Var(nil), in...), out...) {
		if v == nil || v.tape != t {
			return fmt.Errorf("%w: op %s: a Var is missing or belongs to another tape", ErrArg, name)
		}
	}
	n := &node{name: name, in: in, out: out, fwd: fwd, bwd: bwd, fwdGrads: fwdGrads,
		acc: make([]bool, len(in)), sole: make([]bool, len(in)), wantsIn: make([]bool, len(in)), outNeeded: make([]bool, len(out))}
	n.grads.n = n
	req := false
	for _, v := range in {
		req = req || v.requires
	}
	for _, v := range out {
		if v.param || v.producer != nil || v.alias != nil {
			return fmt.Errorf("%w: op %s: output %s is a param, an alias or another op's output", ErrArg, name, v.Name)
		}
		v.producer = n
		v.requires = req && !fwdGrads
	}
	t.nodes = append(t.nodes, n)
	return nil
}

// Build decides gradient order and allocates gradients (grads true) or
// none (grads false: a forward-only tape for evaluation and generation,
// where Backward fails). Record nothing after Build.
func (t *Tape) Build(grads bool) error {
	if t.built {
		return ErrBuilt
	}
	t.built, t.grads = true, grads
	if !grads {
		return nil
	}
	// A loss node's input gradients are written first (in the forward).
	order := make([]*node, 0, len(t.nodes))
	for _, n := range t.nodes {
		if n.fwdGrads {
			order = append(order, n)
		}
	}
	for i := len(t.nodes) - 1; i >= 0; i-- {
		if !t.nodes[i].fwdGrads {
			order = append(order, t.nodes[i])
		}
	}
	// A node's backward runs when some output's gradient is written by
	// a later node (or it is a loss). Walk in backward order so each
	// node's outputs are settled before it.
	for _, n := range order {
		run := n.fwdGrads
		for i, o := range n.out {
			n.outNeeded[i] = len(o.root().writers) > 0 && o.requires
			run = run || n.outNeeded[i]
		}
		if !n.fwdGrads && n.bwd == nil {
			run = false
		}
		n.runBwd = run && !n.fwdGrads
		if !run {
			continue
		}
		for i, v := range n.in {
			if !v.requires {
				continue
			}
			r := v.root()
			n.wantsIn[i] = true
			n.acc[i] = len(r.writers) > 0
			r.writers = append(r.writers, writer{n: n, in: i})
		}
	}
	for _, v := range t.vars {
		if v.alias == nil && len(v.writers) == 1 {
			w := v.writers[0]
			w.n.sole[w.in] = true
		}
	}
	// The last writer of each param's gradient in backward order is where
	// the gradient becomes final (OnGradReady).
	for _, v := range t.vars {
		if !v.param {
			continue
		}
		if k := len(v.writers); k == 0 || v.writers[k-1].n.fwdGrads {
			t.readyFirst = append(t.readyFirst, v)
		} else {
			n := v.writers[k-1].n
			n.ready = append(n.ready, v)
		}
	}
	// Allocate root gradients, then derive alias gradients.
	for _, v := range t.vars {
		if v.alias != nil || !v.requires || v.Grad != nil {
			continue
		}
		if len(v.writers) == 0 {
			continue // nothing flows here: Out(i) reports nil
		}
		g, err := tensor.Alloc(t.alloc, t.bufName("grads", v.Name), v.Value.DType, v.Value.Shape...)
		if err != nil {
			return fmt.Errorf("autograd: allocating the gradient of %s: %w", v.Name, err)
		}
		t.owned = append(t.owned, g)
		v.Grad = g
	}
	for _, v := range t.vars {
		if v.alias == nil || !v.requires {
			continue
		}
		r := v.root()
		if r.Grad == nil {
			continue
		}
		g, err := v.resolveGrad()
		if err != nil {
			return fmt.Errorf("autograd: gradient of alias %s: %w", v.Name, err)
		}
		v.Grad = g
	}
	for _, v := range t.vars {
		if v.param && len(v.writers) == 0 && v.Grad != nil && t.fill != nil {
			if err := t.fill(v.Grad, 0); err != nil {
				return fmt.Errorf("autograd: zeroing the unused gradient of %s: %w", v.Name, err)
			}
		}
	}
	return nil
}

func (v *Var) resolveGrad() (*tensor.Tensor, error) {
	if v.alias == nil {
		return v.Grad, nil
	}
	if v.Grad != nil {
		return v.Grad, nil
	}
	base, err := v.alias.resolveGrad()
	if err != nil || base == nil {
		return nil, err
	}
	return v.gradOf(base)
}

// Forward runs every node's forward step in record order.
func (t *Tape) Forward() error {
	if !t.built {
		return ErrBuilt
	}
	t.ranFwd = false
	for _, n := range t.nodes {
		if n.fwd == nil {
			continue
		}
		if err := n.fwd(&n.grads); err != nil {
			return fmt.Errorf("autograd: forward %s: %w", n.name, err)
		}
	}
	t.ranFwd = true
	return nil
}

// OnGradReady makes every later Backward call fn(v) for each Param v as
// soon as v's gradient is final: right after the backward step of the
// node that is the last writer of that gradient in backward order (a tied
// weight is final only after its last consumer's contribution: the token
// embedding of a GPT whose head shares it, written first by the head's
// GEMM and last by the embedding's backward), or when Backward starts for
// a Param written by no node (its gradient holds the zeros of Build) or
// only by a loss node (written in the forward). Each Param is reported
// exactly once per Backward, in that order; Params that become final at
// the same node come in the node's input order.
//
// fn runs on the calling goroutine at queue time, like the steps: on a
// device that queues work, "final" means the last write is queued before
// anything fn queues — on the engine's main stream, or on its side stream
// for a sole writer (Grads.Sole: ops' weight gradients) — so a collective
// fn queues on a stream forked from both at that point
// (ops.Engine.CommSide; PyTorch DDP's autograd hook that marks a
// parameter ready for its bucket, torch/csrc/distributed/c10d/reducer.cpp)
// sees the whole gradient, and a step captured as a CUDA graph captures
// fn's work with the rest. An error from fn stops the Backward. fn nil
// removes the hook.
func (t *Tape) OnGradReady(fn func(v *Var) error) { t.onReady = fn }

func (t *Tape) ready(vs []*Var) error {
	if t.onReady == nil {
		return nil
	}
	for _, v := range vs {
		if err := t.onReady(v); err != nil {
			return fmt.Errorf("autograd: gradient of %s ready: %w", v.Name, err)
		}
	}
	return nil
}

// Backward runs, in reverse record order, the backward step of every node
// through which a gradient flows, and the OnGradReady hook as gradients
// become final. It needs a Forward since the last Backward (else
// ErrNoForward) and a tape built with gradients.
func (t *Tape) Backward() error {
	if !t.built || !t.grads {
		return fmt.Errorf("%w: backward on a tape built without gradients", ErrBuilt)
	}
	if !t.ranFwd {
		return ErrNoForward
	}
	t.ranFwd = false
	if err := t.ready(t.readyFirst); err != nil {
		return err
	}
	for i := len(t.nodes) - 1; i >= 0; i-- {
		n := t.nodes[i]
		if !n.runBwd {
			continue
		}
		if err := n.bwd(&n.grads); err != nil {
			return fmt.Errorf("autograd: backward %s: %w", n.name, err)
		}
		if err := t.ready(n.ready); err != nil {
			return err
		}
	}
	return nil
}

// Len is the number of recorded nodes.
func (t *Tape) Len() int { return len(t.nodes) }

// Free releases every buffer the tape allocated (values from Alloc and
// gradients from Build); params' buffers are the caller's.
func (t *Tape) Free() error {
	var errs []error
	for _, x := range t.owned {
		if err := x.Buf.Free(); err != nil {
			errs = append(errs, err)
		}
	}
	t.owned = nil
	return errors.Join(errs...)
}
