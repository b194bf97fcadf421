// Package nn holds gpukit's layers and models over static, preallocated
// buffers: Linear layers and an MLP classifier trained with softmax
// cross-entropy. A model allocates its parameters, gradients and activations
// once through a device.Allocator (named, so a pool can share them with other
// processes), records its graph once, and then runs Forward and Backward
// every step without allocating. The MLP keeps a hand-fused chain of
// layers (each activation derivative fused into the next layer's data
// gradient GEMM); the GPT (optionally with Mixture-of-Experts MLPs:
// moe.go) and the diffusion U-Net (unet.go: one flat
// parameter buffer, an EMA of it, PyTorch's state-dict names) record their
// forward on an ops.Graph, whose autograd.Tape derives the backward of any
// DAG. The Hierarchical Reasoning Model (hrm.go, hrm_step.go, hrm_eval.go:
// sapientinc/HRM on Sudoku in bench/reference/hrm.py's layout) adds
// recurrent segments with adaptive halting: a training step is one
// capturable unit whose halting, refill of halted slots and metrics stay
// on the device (ops' act family), and its evaluation loop body can be
// the body of a conditional WHILE graph node.
//
// Initialisation is PyTorch's nn.Linear default: weights and biases drawn
// from U(−1/√fan_in, 1/√fan_in), which for weights is kaiming_uniform_ with
// a = √5 (He et al. 2015, "Delving Deep into Rectifiers"; bound
// gain·√(3/fan_in) with gain = √(2/(1+a²))). The draws come from math/rand/v2's
// PCG seeded by MLPConfig.Seed, layer by layer (weight row-major, then bias),
// so the same seed gives the same weights on every machine.
package nn
