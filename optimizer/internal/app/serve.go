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
	"gpukit/libgpu/ipc"
	"gpukit/libgpu/ops"
	"gpukit/libgpu/optim/service"
	"gpukit/libgpu/pool"
)

var serveCommand = &cli.Command{
	Name:  "serve",
	Usage: "serve optimizer steps over a socket",
	Description: `serve connects to the pool at --pool, listens on --socket (refusing a socket
a live service answers on, replacing a stale one), prints the socket path on
stdout when ready and serves until SIGTERM or SIGINT, when it closes every
connection (each run's state is released) and exits 0.

Each connection registers one run: the trainer's parameter and gradient
buffers by pool name and an optimizer (libgpu/optim.Spec), then sends one
message per step. Runs step on streams of their own, at --precision.`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "socket", Aliases: []string{"s"}, Usage: "(required) socket path to listen on, in an existing directory ('@name': abstract)"},
		&cli.StringFlag{Name: "pool", Usage: "(required) gpupool socket: where the trainer's buffers are and the state goes"},
		&cli.StringFlag{Name: "precision", Value: "tf32", Usage: "f32 GEMMs: f32, tf32 or bf16 (tensor cores; the host computes f32)"},
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "log runs and connection problems on stderr"},
	},
	Action: serve,
}

func serve(c *cli.Context) error {
	if err := kit.Require(c, "socket", "pool"); err != nil {
		return err
	}
	if err := kit.NoArgs(c); err != nil {
		return err
	}
	prec, err := ops.ParsePrecision(c.String("precision"))
	if err != nil {
		return kit.Usagef("--precision %v", err)
	}
	sock := c.String("socket")
	if _, err := kit.CheckSocketDir(sock, true); err != nil {
		return err
	}
	mem, err := pool.Dial(c.String("pool"))
	if err != nil {
		return fmt.Errorf("--pool %s: %w", c.String("pool"), err)
	}
	defer mem.Close()
	srv := &ipc.Server{Handler: &service.Server{Mem: mem, Pool: c.String("pool"), Options: ops.Options{Precision: prec}}}
	if c.Bool("verbose") {
		logger := log.New(c.App.ErrWriter, "", 0)
		srv.Logf = logger.Printf
		srv.Handler.(*service.Server).Logf = logger.Printf
	}
	l, err := ipc.Listen(sock)
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
