package ops_test

import (
	"testing"

	"gpukit/libgpu/device"
	"gpukit/libgpu/nn"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/tensor"
)

// TestCUDAGPTStepPrefetched records nanoGPT-shaped training graphs (bf16
// autocast, dropout, head dimensions 64 and 128: the mma.sync and, on
// sm_90a, the wgmma attention) and an evaluation graph, runs a forward and
// backward, and checks that every kernel the step launched was queued for
// compilation while the graph was recorded (ops' prefetch hints), so none
// waited for a compilation started at its first launch.
func TestCUDAGPTStepPrefetched(t *testing.T) {
	d := gpu(t)
	for _, heads := range []int{6, 3} {
		e := cudaEngine(t, d, ops.PrecBF16)
		a := device.Local{Dev: d}
		cfg := nn.GPTConfig{Vocab: 65, Layers: 2, Heads: heads, DModel: 384, Block: 64, Dropout: 0.1}
		m, err := nn.NewGPT(a, "gpt", cfg, true, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Free() })
		counter, err := tensor.Alloc(a, "", tensor.I32, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { counter.Buf.Free() })
		if err := e.Fill(counter, 0); err != nil {
			t.Fatal(err)
		}
		opts := ops.GraphOptions{Autocast: tensor.BF16, Train: true, Seed: 7, Counter: counter}
		s, err := m.Record(e, a, "train", 4, opts, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Free() })
		ev, err := m.Record(e, a, "eval", 4, ops.GraphOptions{Autocast: tensor.BF16}, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ev.Free() })
		idx := make([]int32, 4*cfg.Block)
		for i := range idx {
			idx[i] = int32(i * 7 % cfg.Vocab)
		}
		for _, st := range []*nn.GPTStep{s, ev} {
			for _, in := range []*tensor.Tensor{st.Idx, st.Targets} {
				if err := in.Write(tensor.AsBytes(idx)); err != nil {
					t.Fatal(err)
				}
			}
		}
		err = e.Do(func() error {
			if err := s.Graph.Forward(); err != nil {
				return err
			}
			if err := s.Graph.Backward(); err != nil {
				return err
			}
			return ev.Graph.Forward()
		})
		if err == nil {
			err = e.Sync()
		}
		if err != nil {
			t.Fatal(err)
		}
		if od := e.OnDemandKernels(); len(od) > 0 {
			t.Errorf("head dimension %d: kernels first launched without a prefetch: %v", cfg.DModel/heads, od)
		}
	}
}
