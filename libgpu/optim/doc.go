// Package optim holds optimizer objects over nn.Params: AdamW and SGD with
// momentum. Each owns its state buffers (moments, momentum buffers, step
// counter), allocated once through a device.Allocator under
// prefix+"/optim/<state name>" zero-initialised (Reset zeroes them again with ops Fill), and
// applies the update rules of package ops (which cite their sources) in one
// engine call per step, so a CUDA backend can capture the step in a graph.
// State names follow PyTorch's optimizer state_dict: "<param>.exp_avg",
// "<param>.exp_avg_sq", "step" for AdamW, "<param>.momentum_buffer" for SGD.
package optim
