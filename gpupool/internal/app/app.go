package app

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"gpukit/libgpu/pool"
)

// ErrUsage marks bad command-line input (exit status 2).
var ErrUsage = errors.New("usage")

// ExitCode is the process exit status for an error returned by Run.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrUsage):
		return 2
	}
	return 1
}

// Main runs the app on args and returns the exit status, having printed
// any error as one line on stderr.
func Main(args []string) int {
	err := New().Run(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpupool:", err)
	}
	return ExitCode(err)
}

const description = `gpupool owns memory that several processes share: it hands out buffers from
slabs (CUDA VMM on a GPU, memfd in host memory) over a Unix socket, passes
each slab's fd once per client (SCM_RIGHTS), keeps named buffers other
processes can open (legacy CUDA IPC handles for CuPy and PyTorch on request),
and releases a client's buffers when its connection ends.
Start it with "gpupool serve"; the other subcommands are clients of a running
daemon. Tools reach it through gpukit/libgpu/pool.`

// New returns the gpupool command line.
func New() *cli.App {
	a := &cli.App{
		Name:        "gpupool",
		Usage:       "share GPU or host memory between processes",
		Description: description,
		Commands: []*cli.Command{
			serveCommand, allocCommand, freeCommand, rmCommand, putCommand, getCommand, lsCommand, statsCommand,
		},
		HideHelpCommand: true,
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return fmt.Errorf("%w: unknown command %q (see gpupool --help)", ErrUsage, c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
		OnUsageError:   usageError,
		ExitErrHandler: func(*cli.Context, error) {},
	}
	for _, c := range a.Commands {
		c.OnUsageError = usageError
	}
	return a
}

func usageError(c *cli.Context, err error, isSub bool) error {
	name := "gpupool"
	if isSub && c.Command != nil {
		name += " " + c.Command.Name
	}
	return fmt.Errorf("%w: %v (see %s --help)", ErrUsage, err, name)
}

// DefaultSocket is $GPUKIT_POOL_SOCKET, else $XDG_RUNTIME_DIR/gpukit/pool.sock,
// else /tmp/gpukit-$UID/pool.sock.
func DefaultSocket() string {
	if s := os.Getenv("GPUKIT_POOL_SOCKET"); s != "" {
		return s
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "gpukit", "pool.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("gpukit-%d", os.Getuid()), "pool.sock")
}

func socketFlag() cli.Flag {
	return &cli.StringFlag{
		Name:  "socket",
		Usage: "pool socket path (default: $GPUKIT_POOL_SOCKET, else $XDG_RUNTIME_DIR/gpukit/pool.sock, else /tmp/gpukit-$UID/pool.sock)",
	}
}

func socketPath(c *cli.Context) string {
	if s := c.String("socket"); s != "" {
		return s
	}
	return DefaultSocket()
}

var waitFlag = &cli.DurationFlag{
	Name:  "wait",
	Usage: "keep trying to reach the daemon for this long (for scripts that just started it)",
}

// dial connects to the pool, retrying for --wait.
func dial(c *cli.Context) (*pool.Client, error) {
	path := socketPath(c)
	deadline := time.Now().Add(c.Duration("wait"))
	for {
		cl, err := pool.Dial(path)
		if err == nil || !errors.Is(err, pool.ErrUnreachable) || time.Now().After(deadline) {
			return cl, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func clientFlags() []cli.Flag { return []cli.Flag{socketFlag(), waitFlag} }

// ParseSize reads a byte count: a plain integer, or one with a suffix
// K/M/G/T (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024), any case.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suf string
		mul int64
	}{
		{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
		{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
		{"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"t", 1e12}, {"b", 1},
	}
	mul := int64(1)
	lower := strings.ToLower(t)
	for _, u := range units {
		if strings.HasSuffix(lower, u.suf) {
			t, mul = t[:len(t)-len(u.suf)], u.mul
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mul {
		return 0, fmt.Errorf("%w: bad size %q (a positive byte count like 4096, 64MiB or 1G)", ErrUsage, s)
	}
	return n * mul, nil
}
