package app

import (
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/cli/devflag"
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/ops"
	"gpukit/optimizer/internal/server"
)

var serveCommand = &cli.Command{
	Name:  "serve",
	Usage: "serve optimizer steps over a socket",
	Description: `serve connects to the pool at --pool, listens on --socket (refusing a socket
a live service answers on, replacing a stale one), prints the socket path on
stdout when ready and serves until SIGTERM or SIGINT, when it closes every
connection (each run's state is released) and exits 0.

Each connection registers one run: the trainer's parameter and gradient
buffers by pool name and an optimizer (libgpu/optim.Spec), with a
connection to the pool the trainer made itself: the service opens the
buffers and allocates the run's state through it, so it can do in the pool
only what the trainer's uid could (also under gpupool --isolate), charged
to that uid's quota. Then one message per step. Runs step on streams of
their own, at --precision.

Only the service's own uid, root, --allow-uid and the members of --group
may connect (SO_PEERCRED); run names are the uid's own. At start the
service raises its open file limit to the hard limit; past --max-conns, or
out of file descriptors, a request fails with an error naming the limit and
the service goes on (stats shows the limits).`,
	Flags: append([]cli.Flag{
		&cli.StringFlag{Name: "socket", Aliases: []string{"s"}, Usage: "(required) socket path to listen on, in an existing directory ('@name': abstract)"},
		devflag.Pool("(required) the gpupool daemon where the trainer's buffers are and the state goes"),
		devflag.Precision(ops.PrecTF32, "the service's f32 GEMMs (tensor cores)"),
		&cli.IntFlag{Name: "max-conns", Usage: "most connections (each holds at most one run) served at once; more are told so and closed (default: 1024, or a quarter of the open file limit if less)"},
		kit.SizeFlag("max-run-bytes", "0", "most bytes one run's state and work buffers may take in the pool (0: only the pool's --limit and the uid's --quota-uid bound them)"),
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "log runs and connection problems on stderr"},
	}, kit.PeerFlags("connect")...),
	Action: serve,
}

func serve(c *cli.Context) error {
	if err := kit.Require(c, "socket", "pool"); err != nil {
		return err
	}
	if err := kit.NoArgs(c); err != nil {
		return err
	}
	prec, err := devflag.PrecisionOf(c)
	if err != nil {
		return err
	}
	adm, gid, err := kit.Admission(c)
	if err != nil {
		return err
	}
	maxConns := c.Int("max-conns")
	if maxConns < 0 {
		return kit.Usagef("--max-conns must not be negative")
	}
	maxRun, err := kit.ParseSize(c.String("max-run-bytes"))
	if err != nil || maxRun < 0 {
		return kit.Usagef("--max-run-bytes %q: want a size (0: none)", c.String("max-run-bytes"))
	}
	sock := c.String("socket")
	if _, err := kit.CheckSocketDir(sock, true); err != nil {
		return err
	}
	// Each connection, each run's pool connection and each slab a run maps
	// holds a file descriptor: running out must fail one request, not the
	// service.
	if _, err := ipc.RaiseFDLimit(); err != nil {
		fmt.Fprintf(c.App.ErrWriter, "optimizer: %v (going on with %d)\n", err, ipc.FDLimit())
	}
	if maxConns == 0 {
		maxConns = ipc.ConnLimit()
	}
	mem, err := devflag.DialPool(c)
	if err != nil {
		return err
	}
	defer mem.Close()
	h := &server.Server{Pool: server.PoolClient{C: mem}, Options: ops.Options{Precision: prec}, Admission: adm,
		MaxRunBytes: maxRun, MaxConns: maxConns}
	srv := &ipc.Server{Handler: h, MaxConns: maxConns}
	if c.Bool("verbose") {
		logger := log.New(c.App.ErrWriter, "", 0)
		srv.Logf = logger.Printf
		h.Logf = logger.Printf
	}
	l, err := ipc.ListenWith(sock, &ipc.ListenOptions{HasGroup: gid >= 0, GID: uint32(max(gid, 0))})
	if err != nil {
		if errors.Is(err, ipc.ErrSocketInUse) {
			return fmt.Errorf("--socket %s: a service is already listening there", sock)
		}
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	fmt.Fprintln(c.App.Writer, sock)
	select {
	case <-sig:
		srv.Shutdown()
		<-done
		return nil
	case err := <-done:
		return err
	}
}
