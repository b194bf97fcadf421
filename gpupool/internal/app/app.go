package app

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/pool"
)

// ErrUsage marks bad command-line input (exit status 2); it is libgpu/cli's.
var ErrUsage = kit.ErrUsage

// ExitCode is the process exit status for an error returned by Run.
func ExitCode(err error) int { return kit.ExitCode(err) }

// Main runs the app on args through libgpu/cli and returns the exit status,
// having printed any error as one line on stderr.
func Main(args []string) int { return kit.Main(New(), args) }

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
	}
	return a
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

// ParseSize reads a positive byte count as libgpu/cli spells sizes: 4096,
// 64KiB (= 64K), 64KB (= 64000), 1.5GiB.
func ParseSize(s string) (int64, error) {
	n, err := kit.ParseSize(s)
	if err == nil && n <= 0 {
		err = fmt.Errorf("bad size %q: want a positive byte count like 4096, 64MiB or 1GB", s)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	return n, nil
}
