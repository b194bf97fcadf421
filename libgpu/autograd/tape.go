package autograd

import (
	"errors"
	"fmt"

	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// Errors.
var (
	// ErrFanOut: a Var with a gradient is used as input by a second op.
	ErrFanOut = errors.New("autograd: variable consumed twice (gradients are not accumulated)")
	// ErrNoForward: Backward was called before Forward.
	ErrNoForward = errors.New("autograd: backward before forward")
	// ErrArg: a recorded op is missing a tensor it needs.
	ErrArg = errors.New("autograd: missing argument")
)

// Func is one step of a node, run on an engine.
type Func func(e *ops.Engine) error

// Var is a value and, when gradients flow to it, a gradient buffer of the
// same shape and dtype. Grad nil means "no gradient wanted" (inputs, labels).
type Var struct {
	Value, Grad *tensor.Tensor
	used        bool
}

// NewVar returns a Var over existing buffers; grad may be nil.
func NewVar(value, grad *tensor.Tensor) *Var { return &Var{Value: value, Grad: grad} }

type node struct {
	name          string
	forward, back Func
}

// Tape is a static list of nodes. Record nodes once, then call Forward and
// Backward every step. The zero Tape is empty and ready to use. A Tape is
// not safe for concurrent use.
type Tape struct {
	nodes   []node
	forward bool
}

// Record appends a node. forward runs in Forward in record order; backward
// (may be nil) runs in Backward in reverse order.
func (t *Tape) Record(name string, forward, backward Func) {
	t.nodes = append(t.nodes, node{name: name, forward: forward, back: backward})
}

// Len is the number of recorded nodes.
func (t *Tape) Len() int { return len(t.nodes) }

// Forward runs every node's forward function in record order.
func (t *Tape) Forward(e *ops.Engine) error {
	t.forward = false
	for i := range t.nodes {
		n := &t.nodes[i]
		if n.forward == nil {
			continue
		}
		if err := n.forward(e); err != nil {
			return fmt.Errorf("autograd: forward %s: %w", n.name, err)
		}
	}
	t.forward = true
	return nil
}

// Backward runs every node's backward closure in reverse record order. It
// fails with ErrNoForward unless Forward succeeded since the last Backward.
func (t *Tape) Backward(e *ops.Engine) error {
	if !t.forward {
		return ErrNoForward
	}
	t.forward = false
	for i := len(t.nodes) - 1; i >= 0; i-- {
		n := &t.nodes[i]
		if n.back == nil {
			continue
		}
		if err := n.back(e); err != nil {
			return fmt.Errorf("autograd: backward %s: %w", n.name, err)
		}
	}
	return nil
}

func consume(vs ...*Var) error {
	for _, v := range vs {
		if v == nil || v.Grad == nil {
			continue
		}
		if v.used {
			return ErrFanOut
		}
	}
	for _, v := range vs {
		if v != nil && v.Grad != nil {
			v.used = true
		}
	}
	return nil
}

// Linear records y = act(x·wᵀ + b) (ops.Engine.Linear; shapes x[M,K],
// w[N,K], b[N], y[M,N]). b may be nil. aux ([M,N] f32) stores the
// pre-activation z and is required for ops.ActGELU; it is ignored otherwise.
// The backward closure reads y.Grad and writes w.Grad, b.Grad and x.Grad
// (each only when non-nil). w.Grad must be non-nil. Shapes are checked by
// the engine when the node runs.
func (t *Tape) Linear(name string, y, x, w, b *Var, aux *tensor.Tensor, act ops.Act) error {
	if y == nil || x == nil || w == nil || w.Grad == nil || y.Grad == nil {
		return fmt.Errorf("%w: linear %s needs y, x, w, w.Grad and y.Grad", ErrArg, name)
	}
	if act == ops.ActGELU && aux == nil {
		return fmt.Errorf("%w: linear %s with GELU needs aux", ErrArg, name)
	}
	if act != ops.ActGELU {
		aux = nil
	}
	if err := consume(x, w, b); err != nil {
		return fmt.Errorf("linear %s: %w", name, err)
	}
	var bv, bg *tensor.Tensor
	if b != nil {
		bv, bg = b.Value, b.Grad
	}
	saved := aux // z for GELU
	if act == ops.ActReLU {
		saved = y.Value // y for ReLU
	}
	t.Record(name, func(e *ops.Engine) error {
		return e.Linear(y.Value, x.Value, w.Value, bv, aux, act)
	}, func(e *ops.Engine) error {
		return e.LinearBackward(x.Grad, w.Grad, bg, y.Grad, x.Value, w.Value, saved, act)
	})
	return nil
}

// SoftmaxCrossEntropy records loss[1] = mean cross-entropy of logits[M,C]
// against labels[M] (i32). The forward pass also writes logits.Grad, the
// gradient of the loss itself (the loss is the root: its gradient is 1), so
// the backward closure is empty.
func (t *Tape) SoftmaxCrossEntropy(name string, loss *tensor.Tensor, logits *Var, labels *tensor.Tensor) error {
	if loss == nil || logits == nil || logits.Grad == nil || labels == nil {
		return fmt.Errorf("%w: cross-entropy %s needs loss, logits, logits.Grad and labels", ErrArg, name)
	}
	if err := consume(logits); err != nil {
		return fmt.Errorf("cross-entropy %s: %w", name, err)
	}
	t.Record(name, func(e *ops.Engine) error {
		return e.SoftmaxCrossEntropy(loss, logits.Grad, logits.Value, labels)
	}, nil)
	return nil
}
