// Package driver is the trainer's one run driver: everything a training
// run shares, whatever the model, and the contract a model implements to
// be trained by it (torchtitan's TrainSpec registry beside its one
// train.py is the pattern: torchtitan/protocols/train_spec.py).
//
// # What the driver owns
//
// Run is the loop. It owns: the step runner (Runner: staging slots, the
// step eager or captured once and replayed as one CUDA graph, eager work
// after it); the cadence of loss lines (--log-every), evaluations and
// checkpoints; JSON lines on stdout and metrics.jsonl (cut back to the
// checkpoint's step when a run resumes); the progress bar with an ETA
// (libgpu/cli.NewProgress); the plot (loss.png: training and validation
// loss, accuracies below); the checkpoint files (model.safetensors,
// state.safetensors, best.safetensors by validation loss; see
// checkpoint.go) and what a killed run left of them; resuming (ReadResume:
// the state file alone, and the run's --log-every, --precision and
// --graph); stopping (a cancelled context — SIGINT or SIGTERM — ends the
// run after its step with a checkpoint, an evaluation due then left
// pending for the resumed run, so a signal during the last step does not
// wait for a final evaluation); data parallelism (the communicator, the
// broadcast of rank 0's state, the loss and its terms averaged across ranks, the ranks'
// agreement to stop; DP and GradBuckets for the model's gradients, and
// with --shard-optimizer ZeRO-1's parameter buckets and sharded AdamW,
// whose state every rank gathers for rank 0's checkpoint); the
// spans on the trace (trace.go). The trainer's command line
// (internal/app) builds `trainer run`, `eval`, `init` and `generate` from
// the registered models and calls Run.
//
// # What a model provides
//
// A model is a package under trainer/internal/models/NAME that registers
// itself from an init func and is linked in by one blank import in
// internal/app/models.go. Nothing else names it.
//
//	func init() {
//		driver.Register(driver.Model{
//			Name: "hrm", Summary: "...", Data: driver.DataFlag{...},
//			Lines: "{step, loss, lr, ...}: its JSON lines, for run --help",
//			Flags: []cli.Flag{...},           // its own flags, its defaults
//			Resumable: []string{"steps"},     // flags a resumed run may change
//			New:    func(c *cli.Context) (driver.Task, error) {...},
//			Resume: func(c *cli.Context, s driver.Stored) (driver.Task, error) {...},
//			Eval:     &driver.Command{...},   // trainer eval --ckpt (optional)
//			Generate: &driver.Command{...},   // trainer generate --ckpt (optional)
//			Commands: []*cli.Command{solve, data}, // trainer solve, trainer data sudoku
//			DataParallel: false,              // several ranks may train it
//		})
//	}
//
// New reads the flags (errors of bad values wrap ErrConfig through
// Configf: exit 2) and returns a Task; Resume does the same from a run's
// stored configuration (Stored: the JSON of Task.Config, the state file's
// metadata, the step) and the Resumable flags given again. The driver
// refuses every other flag of the model on --resume, and a flag of another
// model always (one line, exit 2). Eval and Generate get the checkpoint
// file (--ckpt, or the best or last file of a run directory, named on
// stderr), the precision, the graph flag and an allocator made on demand;
// a model's own commands that run it (trainer solve) take the same device
// flags (libgpu/cli/devflag's, and --trace) through DeviceFlags and
// NewInput, and Resolve and ReadHeader for a checkpoint. Register panics (at init) on a model flag named like one of
// the driver's (Reserved) or a second model of the same name.
//
// Task (task.go) is the run before any device work: Config (stored as the
// checkpoints' "config"), Steps, Load (the data this rank needs; bad data
// for the flags wraps ErrConfig), Init (the initial weights, for trainer
// init), Build (the model, its optimizer and its recorded step on an Env:
// engine, allocator, run name, precision, graph, world, DP, optimizer
// socket) and Summary (the human line a finished run ends with).
//
// Trainer (task.go) is the task built: Inputs (the step's device inputs)
// and Fill (the host writes step s's inputs into staging, as a function of
// the step so a resumed run draws the same), Compute (one step queued with
// no host synchronisation, its phases through BeginPhase/RunPhases),
// Capturable, Metrics (the loss tensor, the gradient norm, extra loss
// Terms, the throughput's unit and items, FLOPs for MFU, the plot's loss
// label), LR, Checkpoint (Model: the tensors under the PyTorch module's
// names, alone in model.safetensors; State: everything else a resume
// needs, in state.safetensors after Model; metadata) and Load (from the
// state file). Optional interfaces add: Evaluator (EvalEvery, Eval: a
// line's fields and a validation loss, by which best.safetensors is kept),
// Saver (checkpoints every SaveEvery steps besides evaluations),
// Positioner (fields of a loss line before "loss", the MLP's epoch),
// PostStepper (eager device work after each step, outside the captured
// graph), AfterStepper (host work after each step, e.g. publishing a
// snapshot), DataParallel (Replicas and Share: required with Env.DP),
// StateGatherer (a collective every rank runs before rank 0's
// checkpoint: ZeRO-1's optimizer state), EngineTuner (engine options
// beyond the precision).
//
// # The MoE GPT and the HRM
//
// The Mixture-of-Experts GPT (models/moe) is a language model: it
// registers an lm.Variant (internal/lm: the text, the character
// tokenizer, the validation loss, generate, data parallelism and
// nanoGPT's checkpoint names are the GPT's), with Default its shape (6
// layers, 6 heads, d 384), Flags its --experts --top-k --moe-every
// --expert-width --aux-loss --z-loss, Configure setting libgpu/nn's GPT
// configuration's MoE part from them, and Terms the recorded step's
// aux_loss and z_loss tensors, which every loss line carries (averaged
// across ranks as the loss is). Its checkpoints are eval'd and sampled by
// the same commands, keyed by its name.
//
// The HRM registers a Model of its own (models/hrm). A step is one
// segment: the driver runs and counts optimizer steps, so each of a
// batch's up to 16 segments is one Fill (the step's batch staged into the
// model's device pool, from which the sequences that halted take new
// puzzles on the device) and one Compute (forward, backward and optimizer
// step with the carried state), and Steps counts segments. Its step keeps
// its own CUDA graph and step counter (nn.HRMTrain.Run), so it reports
// Capturable false and the driver runs Compute as it is. The carried
// state (hidden states, halting flags, the puzzles in flight) is State in
// its checkpoint, so a run stopped between segments resumes with it. Its
// Eval runs the adaptive-halting loop (one graph per batch with a
// conditional WHILE node) over the test puzzles and returns exact and
// cell accuracy (the plot draws every *accuracy field of the evaluation
// lines) and, as ValLoss, 1 − exact + 1e-6·(1 − cell), by which
// best.safetensors keeps the highest exact accuracy. Its Data names the
// directory of safetensors puzzles; Commands add `trainer solve` and
// `trainer data sudoku|replay`.
package driver
