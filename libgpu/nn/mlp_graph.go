package nn

import (
	"fmt"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// recordGraph records the MLP on an ops.Graph (MLPConfig.Graph): each
// layer a Graph.Linear with the activation fused into its GEMM's epilogue
// (ReLU's backward reads the output, GELU's its saved pre-activation), the
// loss Graph.CrossEntropy over the logits in the activation dtype; the
// tape derives the backward, with the weight-gradient GEMMs writing the f32
// masters' gradients and the bias gradients from their BGRADB epilogues.
// Under bf16 autocast the weights are cast once per step and activations,
// their gradients and the logits are bf16: no per-GEMM casts of f32
// operands.
func (m *MLP) recordGraph(a device.Allocator, ws, bs []*slot) error {
	cfg := m.cfg
	dt := cfg.Autocast
	if dt == 0 {
		dt = tensor.F32
	}
	g := ops.NewGraph(cfg.Graph, a, cfg.Prefix, ops.GraphOptions{Autocast: dt, OnLinear: cfg.OnLinear})
	m.graph = g
	x := g.Input("input", m.input)
	L := len(ws)
	for i := 0; i < L; i++ {
		name := fmt.Sprintf("fc%d", i)
		act := cfg.Act
		if i == L-1 {
			act = ops.ActNone
		}
		x = g.Scope(name).Linear(x, g.Param(name+".weight", ws[i].Value, ws[i].Grad), g.Param(name+".bias", bs[i].Value, bs[i].Grad), act)
	}
	loss := g.CrossEntropy(x, g.Input("labels", m.labels))
	if err := g.Build(true); err != nil {
		return err
	}
	m.logits = &slot{Value: x.Value}
	m.loss = loss.Value
	if x.Value.DType != tensor.F32 {
		lf, err := tensor.Alloc(a, join(cfg.Prefix, "acts", "logits.f32"), tensor.F32, x.Value.Shape...)
		if err != nil {
			return err
		}
		m.bufs = append(m.bufs, lf)
		m.logitsF32 = lf
	}
	return nil
}
