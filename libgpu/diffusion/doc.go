// Package diffusion holds what sampling from (and training) a diffusion
// model needs besides the network and the ops: noise schedules (linear,
// Ho et al. 2020; cosine, Nichol & Dhariwal 2021), the samplers' update
// rules as per-step coefficient tables (DDPM, Ho et al. 2020; DDIM with
// η, Song et al. 2021; DPM-Solver++(2M), Lu et al. 2022; with
// classifier-free guidance, Ho & Salimans 2022), and Sampler, which runs a
// U-Net's sampling loop — the model evaluations and one fused
// ops.DiffusionStep kernel per step — captured as one CUDA graph on a GPU.
// The float64 arithmetic of every rule is checked in the tests against
// each paper's own form of the update.
package diffusion
