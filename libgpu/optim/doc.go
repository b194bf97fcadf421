// Package optim holds optimizer objects over nn.Params: AdamW and SGD with
// momentum, Adam-atan2 and sign-SGD (the update rules of sapientinc/HRM),
// and the second-order methods Shampoo, SOAP, Muon and K-FAC.
// Each owns its state buffers (moments, statistics, roots, eigenbases,
// step counter), allocated once through a device.Allocator under
// prefix+"/optim/<state name>" zero-initialised (Reset zeroes them again
// with ops Fill), and applies the update rules of package ops (which cite
// their sources) with every call queued on the engine: no step waits for
// the device (but the first after construction, which reads the step
// counter).
//
// State names follow PyTorch's optimizer state_dict where there is one:
// "<param>.exp_avg", "<param>.exp_avg_sq", "step" for AdamW,
// "<param>.momentum_buffer" for SGD; the second-order methods document
// theirs at their constructors. State lists everything a checkpoint needs
// for an exact resume; buffers used only within a step are allocated under
// prefix+"/optim/work/" and are not state.
//
// Shampoo, SOAP and K-FAC refresh their preconditioners (inverse roots,
// eigenbases, inverses) on a schedule (RootOptions): synchronously in the
// step, or asynchronously on the engine's side stream (ops.Engine.Side)
// from a snapshot of the statistics, put in use a fixed number of steps
// later (bounded staleness), so that a step never waits for a root (the
// device times the main stream's wait for each: RootStats). An
// asynchronous refresh after the first two of each job replays that job's
// side-stream work from a graph captured once (the host then spends a
// launch, not the hundreds of ops and library calls of a refresh);
// cuSOLVER eigendecompositions, which work partly on the host, cannot be
// captured and stay eager (ops.Eigh). Their
// schedules live on the host, so their steps are not captured whole
// (Capturer); Shampoo's and SOAP's are captured per phase instead
// (Phaser: every step but those where a refresh starts or is put in use
// queues the same device work — the step counter, bias corrections and
// learning-rate scale live on the device — and may replay one graph).
// Shampoo and SOAP batch their GEMMs over the parameters of each block
// shape (groups.go). Muon, AdamW, SGD, Adam-atan2 and sign-SGD may be
// captured into a CUDA graph.
//
// Spec and New build any of them from a flat, serialisable description
// (command lines, and the optimizer service's register message:
// libgpu/optim/service, served by the optimizer tool's
// optimizer/internal/server).
package optim
