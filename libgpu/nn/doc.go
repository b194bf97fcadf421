// Package nn holds gpukit's models over static, preallocated buffers, each
// allocated once through a device.Allocator (named, so a pool can share
// them with other processes), recorded once, and then run every step
// without allocating, so that a whole step can be captured as one CUDA
// graph. A model's parameters are Params (name, value, gradient) under
// the names of the PyTorch module a checkpoint loads into. It owns:
//
//   - the MLP classifier (mlp.go, steps.go, mlp_graph.go, flops.go):
//     Linear layers trained with softmax cross-entropy, either as a
//     hand-fused chain (each activation's derivative fused into the next
//     layer's data-gradient GEMM) or, with MLPConfig.Graph, recorded on an
//     ops.Graph (bf16 activations under autocast); its step's FLOPs;
//   - the GPT (gpt.go: nanoGPT's shape and state-dict names), optionally
//     with Mixture-of-Experts MLPs (moe.go: routing and grouped GEMMs with
//     the token counts on the device), and its key/value-cache decoder for
//     generation (gpt_decode.go);
//   - the diffusion U-Net (unet.go: one flat parameter buffer, an EMA of
//     it, PyTorch's state-dict names, its training step and evaluation);
//   - the Hierarchical Reasoning Model (hrm.go, hrm_step.go, hrm_eval.go:
//     sapientinc/HRM on Sudoku in bench/reference/hrm.py's layout):
//     recurrent segments with adaptive halting, a training step that is
//     one capturable unit whose halting, refill of halted slots and
//     metrics stay on the device (ops' act family), and an evaluation
//     loop whose body can be the body of a conditional WHILE graph node.
//
// The GPT, the U-Net and the HRM record their forward on an ops.Graph,
// whose autograd.Tape derives the backward of any DAG; the MLP's chain
// exists because its fusion crosses node boundaries. Optimizers are
// libgpu/optim's, the training loops the trainer's (trainer/internal).
//
// The MLP's initialisation is PyTorch's nn.Linear default: weights and
// biases drawn from U(−1/√fan_in, 1/√fan_in), which for weights is
// kaiming_uniform_ with a = √5 (He et al. 2015, "Delving Deep into
// Rectifiers"; bound gain·√(3/fan_in) with gain = √(2/(1+a²))). The
// draws come from math/rand/v2's PCG seeded by MLPConfig.Seed, layer by
// layer (weight row-major, then bias), so the same seed gives the same
// weights on every machine; the other models document theirs (the GPT's
// is nanoGPT's _init_weights) at their constructors.
package nn
