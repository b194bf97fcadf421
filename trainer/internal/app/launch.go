package app

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/dist/launch"
)

func launchCommand() *cli.Command {
	return &cli.Command{
		Name:      "launch",
		Usage:     "start one process per GPU of this machine for data-parallel training, as torchrun does",
		ArgsUsage: "-- COMMAND [ARGS...]",
		Description: "launch starts --nproc copies of COMMAND, rank i with torchrun's environment: RANK, LOCAL_RANK,\n" +
			"WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (rank 0's\n" +
			"rendezvous). A COMMAND that is a trainer subcommand (run, eval, ...) runs this trainer binary:\n" +
			"`trainer launch --nproc 2 -- run --model gpt ...`; any other is a program from $PATH (a torchrun script\n" +
			"works: `trainer launch --nproc 2 -- python3 train.py`). Every GPU stays visible (CUDA_VISIBLE_DEVICES\n" +
			"is left alone) and each rank takes GPU LOCAL_RANK, as torchrun's scripts do, so NCCL sees the whole\n" +
			"machine. NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 are set\n" +
			"where unset (NVLink multicast can take a shared GPU host out of service).\n" +
			"Each rank runs in a process group of its own and dies with the launcher (PR_SET_PDEATHSIG).\n" +
			"SIGINT and SIGTERM are passed to every rank (a second one kills them). When a rank exits non-zero or\n" +
			"is killed, the others get SIGTERM and, after --grace, SIGKILL; launch then prints one line naming the\n" +
			"rank and how it ended, and exits with that rank's status (128+N for signal N). With every rank done\n" +
			"and exiting 0, launch exits 0. Several machines: run launch on each with the same --nnodes,\n" +
			"--master-addr (machine 0's address) and --master-port, and --node-rank 0, 1, ...",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nproc", Value: 1, Usage: "processes on this machine, one per GPU"},
			&cli.IntFlag{Name: "nnodes", Value: 1, Usage: "machines in the job"},
			&cli.IntFlag{Name: "node-rank", Usage: "this machine's index in 0..nnodes-1"},
			&cli.StringFlag{Name: "master-addr", Usage: "address of machine 0, where rank 0 runs (default 127.0.0.1 on one machine)"},
			&cli.IntFlag{Name: "master-port", Usage: "rank 0's rendezvous port (0: a free port; one machine only)"},
			&cli.DurationFlag{Name: "grace", Value: launch.DefaultGrace, Usage: "how long stopped ranks have to exit before SIGKILL"},
			&cli.BoolFlag{Name: "verbose", Usage: "say on stderr when ranks start and are stopped"},
		},
		Action: runLaunch,
	}
}

func runLaunch(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		return kit.Usagef("launch: no command (trainer launch --nproc N -- run ...)")
	}
	if args[0] == "launch" {
		return kit.Usagef("launch: a launch inside a launch")
	}
	if c.App.Command(args[0]) != nil { // a trainer subcommand runs as this binary

		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("launch: finding this trainer binary: %w", err)
		}
		args = append([]string{self}, args...)
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	cfg := launch.Config{
		Command:    args,
		NProc:      c.Int("nproc"),
		NNodes:     c.Int("nnodes"),
		NodeRank:   c.Int("node-rank"),
		MasterAddr: c.String("master-addr"),
		MasterPort: c.Int("master-port"),
		Stdout:     c.App.Writer,
		Stderr:     c.App.ErrWriter,
		Signals:    sigs,
		Grace:      c.Duration("grace"),
	}
	if c.Bool("verbose") {
		cfg.Logf = func(format string, a ...any) { fmt.Fprintf(c.App.ErrWriter, "trainer: "+format+"\n", a...) }
	}
	err := launch.Run(c.Context, cfg)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, launch.ErrConfig):
		return fmt.Errorf("%w: %w", kit.ErrUsage, err)
	case errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist):
		return cli.Exit(fmt.Sprintf("trainer: launch: %s: command not found", args[0]), 127)
	}
	return cli.Exit("trainer: launch: "+err.Error(), launch.Status(err))
}
