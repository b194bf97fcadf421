package nn

import (
	"fmt"

	"gpukit/libgpu/autograd"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// slot is a value and, when a gradient flows to it, its gradient buffer.
type slot struct {
	Value, Grad *tensor.Tensor
}

// step is one hand-fused node of the MLP: a forward and a backward run on
// an engine.
type step struct {
	name          string
	forward, back func(e *ops.Engine) error
}

// steps is the MLP's fixed list of nodes. The MLP fuses each activation's
// derivative into the next layer's data-gradient GEMM
// (ops.Engine.LinearBackwardChain), which crosses node boundaries, so it
// keeps this hand-written chain instead of autograd.Tape's general DAG.
type steps struct {
	nodes   []step
	forward bool
}

func (s *steps) record(name string, fwd, back func(e *ops.Engine) error) {
	s.nodes = append(s.nodes, step{name: name, forward: fwd, back: back})
}

func (s *steps) runForward(e *ops.Engine) error {
	s.forward = false
	for _, n := range s.nodes {
		if n.forward == nil {
			continue
		}
		if err := n.forward(e); err != nil {
			return fmt.Errorf("nn: forward %s: %w", n.name, err)
		}
	}
	s.forward = true
	return nil
}

func (s *steps) runBackward(e *ops.Engine) error {
	if !s.forward {
		return autograd.ErrNoForward
	}
	s.forward = false
	for i := len(s.nodes) - 1; i >= 0; i-- {
		n := s.nodes[i]
		if n.back == nil {
			continue
		}
		if err := n.back(e); err != nil {
			return fmt.Errorf("nn: backward %s: %w", n.name, err)
		}
	}
	return nil
}
