// Package app is the trainer's command line: New builds the urfave/cli
// application (run, eval, init and the subcommands still to come), Main runs
// it through libgpu/cli, which turns every error into one line on stderr and
// an exit status (1 for a failure, 2 for bad usage or something not built
// yet).
package app
