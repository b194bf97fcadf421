package moe

import (
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// TestTerms: the loss lines' aux_loss and z_loss read the first and the
// second element of the recorded step's AuxLosses; a dense GPT's step
// has none.
func TestTerms(t *testing.T) {
	a := device.Local{Dev: device.NewHost()}
	e, err := ops.NewEngine(a.Device(), ops.Options{Precision: ops.PrecF32})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig().Model
	cfg.Vocab, cfg.Layers, cfg.Heads, cfg.DModel, cfg.Block = 10, 2, 2, 8, 4
	for _, moe := range []bool{true, false} {
		c := cfg
		if !moe {
			c.MoE = nil
		}
		m, err := nn.NewGPT(a, "", c, true, 1)
		if err != nil {
			t.Fatal(err)
		}
		s, err := m.Record(e, a, "", 2, ops.GraphOptions{Autocast: tensor.F32}, true)
		if err != nil {
			t.Fatal(err)
		}
		terms := Terms(s)
		if !moe {
			if terms != nil {
				t.Fatalf("a dense GPT's step has terms %v", terms)
			}
		} else {
			if err := s.AuxLosses.WriteF32([]float32{1.25, 3.5}); err != nil {
				t.Fatal(err)
			}
			if len(terms) != 2 || terms[0].Name != "aux_loss" || terms[1].Name != "z_loss" {
				t.Fatalf("terms %v", terms)
			}
			for i, want := range []float32{1.25, 3.5} {
				v, err := terms[i].T.ReadF32()
				if err != nil || len(v) != 1 || v[0] != want {
					t.Fatalf("%s reads %v (%v), want %v", terms[i].Name, v, err, want)
				}
			}
		}
		s.Free()
		m.Free()
	}
}

// TestDefaultConfig: nanoMoE's network on the GPT's default run.
func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	m := c.Model
	if m.Layers != 6 || m.Heads != 6 || m.DModel != 384 || m.MoE == nil || *m.MoE != nn.DefaultMoE() {
		t.Fatalf("default network %+v (MoE %+v)", m, m.MoE)
	}
	if m.MoELayers() != 3 || !m.IsMoE(1) || m.IsMoE(0) {
		t.Fatalf("MoE blocks: %d", m.MoELayers())
	}
}
