// Package autograd is gpukit's reverse-mode differentiation over a static
// graph: a Tape of recorded nodes, each a forward step and a backward step
// over buffers allocated once, so a whole training step can be captured as
// one CUDA graph and replayed.
//
// The tape knows nothing of devices or kernels: op families (package ops)
// record their nodes through Tape.Op and Tape.Loss with closures that call
// their kernels. The tape decides which Vars need gradients, allocates
// them, and tells each node whether to overwrite or accumulate each input
// gradient (Grads.Acc), so any DAG — residual streams, tied weights, a
// value read by several ops — gets summed gradients with no zeroing pass.
// Aliases (reshapes, permutations and casts of a Var) share their root's
// gradient.
package autograd
