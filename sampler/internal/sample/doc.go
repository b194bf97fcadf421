// Package sample is the sampler's logic below its command line: loading a
// diffusion model from a checkpoint or from a weight snapshot in the
// pool, running libgpu/diffusion's sampling loops for images and video,
// writing PNG grids, GIFs and PNG frames, and scoring samples with a
// Fashion-MNIST classifier (class-conditional accuracy and FD-MLP).
package sample
