package app

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/trace"
)

var recordCommand = &cli.Command{
	Name:      "record",
	Usage:     "run a command with tracing on and write the trace",
	ArgsUsage: "-- CMD [ARGS...]",
	Description: "record starts a collector on a private socket, runs CMD with GPUKIT_TRACE pointing at it (so " +
		"every gpukit tool it starts, directly or through a script, traces), waits for it, lets the traced " +
		"processes flush, and closes the file. It exits with CMD's status. SIGINT and SIGTERM are passed to CMD.",
	Flags: []cli.Flag{
		outFlag, maxSizeFlag,
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
		return errors.New("record: no command (tracer record --out FILE -- CMD ARGS...)")
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	dir, err := os.MkdirTemp("", "tracer-record-")
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "trace.sock")
	s, err := startSession(sock, c.String("out"), c.String("max-size"))
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
	runErr := cmd.Start()
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
