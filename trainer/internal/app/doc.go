// Package app is the trainer's command line: New builds the urfave/cli
// application from the models registered with the run driver
// (internal/driver; models.go links them in): run, eval, init and
// generate take the flags of the model they are about (--model, the run
// --resume continues, the checkpoint --ckpt names), launch starts ranks,
// info names the device, and models add their own commands. Main runs it
// through libgpu/cli, which turns every error into one line on stderr and
// an exit status (1 for a failure, 2 for bad usage or something not built
// yet).
package app
