// Package report owns `tracer report`: from a Chrome trace file it computes
// the top names, categories and processes by total and self time of their
// spans (self: a span's duration less its direct children's on the same
// thread), the GPU busy fraction (the union of spans of category "gpu" over
// the wall time from the first span's start to the last span's end), and a
// per-step breakdown of the trainer: for every span named "step" of
// category "trainer", the time of its direct children by name (data,
// forward, backward, optimizer, graph replay, checkpoint), what remains, and
// the GPU time of that process inside the step.
package report
