// Package autograd is gpukit's reverse-mode differentiation: a Tape of
// recorded nodes, each a forward function and the backward closure that
// propagates gradients through it, over buffers allocated once by the
// caller. Graphs are static: a model records its nodes once when it is built,
// and every step then runs Tape.Forward and Tape.Backward over the same
// buffers with no allocation, which is what lets a CUDA backend capture a
// whole training step as one graph and replay it.
//
// Gradients are written, not accumulated: every Var that carries a gradient
// may be consumed by at most one recorded op (chains and trees, as in an MLP);
// recording a second consumer fails with ErrFanOut.
package autograd
