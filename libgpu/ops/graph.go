package ops

import (
	"errors"
	"fmt"
	"strconv"

	"gpukit/libgpu/autograd"
	"gpukit/libgpu/device"
	"gpukit/libgpu/tensor"
)

// Var is a value of a Graph (an autograd.Var).
type Var = autograd.Var

// Grads is what a recorded node's steps see of the gradients (autograd.Grads).
type Grads = autograd.Grads

// GraphOptions configure a Graph.
type GraphOptions struct {
	// Autocast is the dtype of activations and GEMM operands: tensor.F32
	// (or 0) computes everything in f32; tensor.BF16 stores activations
	// in bf16 and runs GEMMs on bf16 copies of the f32 master weights with
	// f32 accumulation (PyTorch's torch.autocast(dtype=torch.bfloat16):
	// norms, softmax and losses compute in f32 internally).
	Autocast tensor.DType
	// Train turns on dropout (and is what ops that behave differently in
	// evaluation read).
	Train bool
	// Eval declares a forward-only graph (Build(false) follows): ops may
	// record fused nodes that have no backward (Graph.ConvBlock), and
	// Build(true) fails.
	Eval bool
	// Seed and Counter drive dropout's counter-based RNG: the mask of
	// call-site k at step s is Philox4x32-10 keyed by Seed at counter
	// (s, k, element). Counter is an i32 scalar on the device that the
	// step increments (the optimizer's step counter), so a captured graph
	// draws new masks on every replay.
	Seed    uint64
	Counter *tensor.Tensor
	// Shard numbers this graph's batch among equal shards of a larger
	// batch (data parallelism: rank r of n holds rows [r·b, (r+1)·b) of a
	// global batch of n·b, every dropout site's tensor leading with the
	// batch): dropout numbers its elements from Shard × the site's
	// elements (Engine.DropoutAt), so the masks are those a graph of the
	// whole batch draws for these rows, and n ranks train as one process
	// on the global batch would. 0 for a graph of the whole batch.
	Shard int
	// OnLinear, when set, is called by every Graph.Linear's backward step,
	// after the gradient of the layer's pre-activation is computed and
	// before the weight-gradient product: weight is the name of the
	// weight Var given to Linear (the parameter's name, before any
	// autocast copy), x the layer's input as [rows, in] and dy the
	// gradient of the loss with respect to its pre-activation as [rows,
	// out] (in the graph's activation dtype; views of the tape's own
	// buffers, valid until the next step overwrites them). K-FAC
	// (libgpu/optim) reads its Kronecker factors' statistics from them with
	// no copy. Work it queues runs on the graph's engine in order with the
	// backward (and is captured with it); an error stops the backward.
	OnLinear func(weight string, x, dy *tensor.Tensor) error
}

// Graph records differentiable ops for one Engine on an autograd.Tape:
// models write only their forward pass as calls of Graph methods (one per
// op family, in that family's file), and the tape derives the backward.
//
// Errors latch: the first failing call records its error, every later
// call returns nil Vars and does nothing, and Err (or Build) reports it,
// so model code can chain calls and check once.
type Graph struct {
	e      *Engine
	tape   *autograd.Tape
	opts   GraphOptions
	scope  string
	shared *graphShared
}

type graphShared struct {
	err   error
	names map[string]int
	casts map[castKey]*Var
	// castBatch: the f32 → bf16 casts of leaves, made by one node (Cast).
	castBatch *castBatch
	sites     int              // dropout call-sites so far
	owned     []*tensor.Tensor // buffers the graph allocated outside the tape (casts)
	side      bool             // some backward step queues work on the side stream
}

type castKey struct {
	v  *Var
	dt tensor.DType
}

// NewGraph returns an empty graph over e whose buffers come from a and are
// named <prefix>/acts/... and <prefix>/grads/... (see autograd.New).
func NewGraph(e *Engine, a device.Allocator, prefix string, opts GraphOptions) *Graph {
	if opts.Autocast == 0 {
		opts.Autocast = tensor.F32
	}
	return &Graph{e: e, opts: opts, tape: autograd.New(a, prefix, e.Fill),
		shared: &graphShared{names: map[string]int{}, casts: map[castKey]*Var{}}}
}

// Engine is the graph's engine.
func (g *Graph) Engine() *Engine { return g.e }

// Tape is the graph's tape.
func (g *Graph) Tape() *autograd.Tape { return g.tape }

// Options is what the graph was made with.
func (g *Graph) Options() GraphOptions { return g.opts }

// ActDType is the dtype of the activations the graph's ops produce.
func (g *Graph) ActDType() tensor.DType { return g.opts.Autocast }

// Scope returns a view of g that names the buffers of the ops recorded
// through it <scope>.<name> ("h.0.attn.out"); everything else is shared.
func (g *Graph) Scope(name string) *Graph {
	s := *g
	if s.scope != "" {
		name = s.scope + "." + name
	}
	s.scope = name
	return &s
}

// Err is the first error any call on the graph (or a scope of it) hit.
func (g *Graph) Err() error { return g.shared.err }

// Fail records err as the graph's error unless one is already recorded;
// family code calls it.
func (g *Graph) Fail(op string, err error) {
	if g.shared.err == nil && err != nil {
		g.shared.err = fmt.Errorf("ops: graph %s: %w", g.name(op), err)
	}
}

// ok reports whether recording may go on: no error yet, and every Var
// present (a nil Var is the result of an earlier failure).
func (g *Graph) ok(vs ...*Var) bool {
	if g.shared.err != nil {
		return false
	}
	for _, v := range vs {
		if v == nil {
			g.shared.err = errors.New("ops: graph: a nil Var (from a failed call?)")
			return false
		}
	}
	return true
}

// name makes a unique buffer name for an op's output in the current scope.
func (g *Graph) name(op string) string {
	base := op
	if g.scope != "" {
		base = g.scope + "." + op
	}
	n := g.shared.names[base]
	g.shared.names[base] = n + 1
	if n == 0 {
		return base
	}
	return base + "#" + strconv.Itoa(n)
}

// Param registers a trainable tensor and its gradient (owned by the
// caller, e.g. a model's named buffers).
func (g *Graph) Param(name string, value, grad *tensor.Tensor) *Var {
	if !g.ok() {
		return nil
	}
	return g.tape.Param(name, value, grad)
}

// Input registers a tensor that wants no gradient (data, labels, indices).
func (g *Graph) Input(name string, value *tensor.Tensor) *Var {
	if !g.ok() {
		return nil
	}
	return g.tape.Input(name, value)
}

// NewOut allocates an op's output Var (named from op in the scope).
// Family code calls it.
func (g *Graph) NewOut(op string, dt tensor.DType, shape ...int) *Var {
	if !g.ok() {
		return nil
	}
	v, err := g.tape.Alloc(g.name(op), dt, shape...)
	if err != nil {
		g.Fail(op, err)
		return nil
	}
	return v
}

// Record records a node (autograd.Tape.Op) whose steps run on the graph's
// engine. Family code calls it.
func (g *Graph) Record(op string, in, out []*Var, fwd, bwd autograd.Func) {
	if !g.ok(in...) || !g.ok(out...) {
		return
	}
	if err := g.tape.Op(g.name(op), in, out, fwd, bwd); err != nil {
		g.Fail(op, err)
	}
}

// RecordLoss records a loss node (autograd.Tape.Loss). Family code calls it.
func (g *Graph) RecordLoss(op string, in []*Var, out *Var, fwd autograd.Func) {
	if !g.ok(in...) || !g.ok(out) {
		return
	}
	if err := g.tape.Loss(g.name(op), in, out, fwd); err != nil {
		g.Fail(op, err)
	}
}

// View returns x viewed with a new shape (tensor.Tensor.View: no copy);
// its gradient is the same view of x's gradient.
func (g *Graph) View(x *Var, shape ...int) *Var {
	if !g.ok(x) {
		return nil
	}
	v, err := x.Value.View(shape...)
	if err != nil {
		g.Fail("view", err)
		return nil
	}
	a, err := g.tape.Alias(g.name("view"), x, v, func(gx *tensor.Tensor) (*tensor.Tensor, error) {
		return gx.View(shape...)
	})
	if err != nil {
		g.Fail("view", err)
		return nil
	}
	return a
}

// Build allocates gradients (grads true: a training graph) and fixes the
// graph (autograd.Tape.Build). It reports the first recording error.
func (g *Graph) Build(grads bool) error {
	if g.shared.err != nil {
		return g.shared.err
	}
	if grads && g.opts.Eval {
		return fmt.Errorf("%w: a graph recorded with GraphOptions.Eval has no gradients", ErrConfig)
	}
	if grads {
		g.prefetch("ops_clip.cu") // a training step clips its gradients (Engine.ClipCoef)
	}
	return g.tape.Build(grads)
}

// Forward runs the forward pass (queued on the engine).
func (g *Graph) Forward() error { return g.tape.Forward() }

// Backward runs the backward pass (queued on the engine). Work that
// backward steps queued on the engine's side stream (weight gradients) is
// joined before it returns, so what follows (clipping, the optimizer)
// sees every gradient.
func (g *Graph) Backward() error {
	if err := g.tape.Backward(); err != nil {
		return err
	}
	if g.shared.side {
		return g.e.Join()
	}
	return nil
}

// Free releases the buffers the graph allocated.
func (g *Graph) Free() error {
	var errs []error
	for _, t := range g.shared.owned {
		errs = append(errs, t.Buf.Free())
	}
	g.shared.owned = nil
	errs = append(errs, g.tape.Free())
	return errors.Join(errs...)
}

// nextSite numbers dropout call-sites in record order.
func (g *Graph) nextSite() int {
	g.shared.sites++
	return g.shared.sites - 1
}
