package app

import (
	"errors"
	"fmt"
	"gpukit/libgpu/atomicfile"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/trace"
)

var recordCommand = &cli.Command{
	Name:      "record",
	Usage:     "run a command with tracing on and write the trace",
	ArgsUsage: "-- CMD [ARGS...]",
	Description: "record starts a collector on a private socket, runs CMD with GPUKIT_TRACE pointing at it (so " +
		"every gpukit tool it starts, directly or through a script, traces), waits for it, lets the traced " +
		"processes flush, and closes the file. It exits with CMD's status (127 when CMD is not found, 126 when it " +
		"cannot be run, 128+N when signal N killed it), and writes the file in every case. SIGINT and SIGTERM are " +
		"passed to CMD. record's own flags come before CMD; everything from CMD on is CMD's.",
	Flags: []cli.Flag{
		outFlag, maxSizeFlag, kit.ForceFlag(),
		&cli.DurationFlag{Name: "drain", Value: 2 * time.Second, Usage: "after CMD exits, wait this long at most for traced processes still connected"},
	},
	Action: runRecord,
}

func runRecord(c *cli.Context) error {
	args := c.Args().Slice()
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		return kit.Usagef("record: no command (tracer record --out FILE -- CMD ARGS...)")
	}
	if err := checkOut(c); err != nil {
		return err
	}
	// A command that cannot be found or run still gets a (valid) trace file,
	// and the status a shell would give: 127 not found, 126 not runnable.
	path, lookErr := exec.LookPath(args[0])
	dir, err := os.MkdirTemp("", "tracer-record-")
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "trace.sock")
	s, err := startSession(sock, c.String("out"), c.String("max-size"), ipc.Admission{Self: uint32(os.Geteuid()), Root: true}, -1)
	if err != nil {
		return err
	}
	self := trace.Open(sock, "tracer", trace.Options{})
	cmd := exec.Command(path, args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, c.App.Writer, c.App.ErrWriter
	cmd.Env = append(os.Environ(), trace.EnvSocket+"="+sock)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	sp := self.Begin("tracer", "record")
	sp.Arg(trace.Str("command", strings.Join(args, " ")))
	runErr := lookErr
	if runErr == nil {
		runErr = cmd.Start()
	}
	startErr := runErr
	if startErr != nil {
		fmt.Fprintf(c.App.ErrWriter, "tracer: record: %s: %s\n", args[0], notRunnable(startErr))
	}
	if runErr == nil {
		sp.Arg(trace.Int("pid", int64(cmd.Process.Pid)))
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
	wait:
		for {
			select {
			case runErr = <-done:
				break wait
			case v := <-sig:
				cmd.Process.Signal(v)
			}
		}
	}
	sp.End()
	self.Close()
	st, err := s.stop(c.Duration("drain"))
	fmt.Fprintln(c.App.ErrWriter, summary(s.out, st))
	if err != nil {
		return err
	}
	var ee *exec.ExitError
	switch {
	case startErr != nil:
		return cli.Exit("", notRunnableStatus(startErr))
	case errors.As(runErr, &ee):
		code := ee.ExitCode()
		if code < 0 { // killed by a signal
			code = 128 + int(ee.Sys().(syscall.WaitStatus).Signal())
		}
		return cli.Exit("", code)
	case runErr != nil:
		return fmt.Errorf("record: %w", runErr)
	}
	return nil
}

// notRunnableStatus is a shell's status for a command that did not start:
// 127 when it is not found, 126 when it is found but cannot be run.
func notRunnableStatus(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return 127
	}
	return 126
}

// notRunnable says why a command did not start, as a shell would.
func notRunnable(err error) string {
	switch {
	case errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist):
		return "command not found"
	case errors.Is(err, fs.ErrPermission):
		return "permission denied"
	}
	return atomicfile.PlainErr(err).Error()
}
