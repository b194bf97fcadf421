package sample

import (
	"encoding/json"
	"strconv"

	"gpukit/libgpu/ckpt"
	"gpukit/libgpu/diffusion"
	"gpukit/libgpu/tensor"
)

// SaveSamples writes samples (f32 [n, S, S, 1]) and their labels (i32
// [n]) to a safetensors file as "samples" and "labels", with what made
// them in the metadata (model source and step, scheduler settings, seed,
// batch): what bench/reference/unet.py compare reads to draw the same
// images in PyTorch.
func SaveSamples(path string, samples []float32, labels []int32, size int, m *Model, po diffusion.PlanOptions, seed uint64, batch int) error {
	n := len(labels)
	pj, err := json.Marshal(map[string]any{"scheduler": po.Scheduler.String(), "steps": po.Steps, "eta": po.Eta,
		"guidance_scale": po.Guidance, "clip": !po.NoClip})
	if err != nil {
		return err
	}
	cj, err := json.Marshal(m.Config)
	if err != nil {
		return err
	}
	return ckpt.WriteFile(path, []ckpt.Entry{
		{Name: "samples", DType: tensor.F32, Shape: []int{n, size, size, m.Config.UNet.InChannels}, Data: tensor.AsBytes(samples)},
		{Name: "labels", DType: tensor.I32, Shape: []int{n}, Data: tensor.AsBytes(labels)},
	}, map[string]string{"format": "gpukit.samples/1", "plan": string(pj), "config": string(cj), "source": m.Source,
		"train_step": strconv.Itoa(m.Step), "seed": strconv.FormatUint(seed, 10), "batch": strconv.Itoa(batch)})
}
