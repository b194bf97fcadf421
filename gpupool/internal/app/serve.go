package app

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/urfave/cli/v2"

	"gpukit/gpupool/internal/server"
	"gpukit/libgpu/ipc"
)

var serveCommand = &cli.Command{
	Name:  "serve",
	Usage: "run the pool daemon on a socket",
	Description: `serve listens on --socket (refusing a socket a live daemon answers on,
replacing a stale one), prints the socket path on stdout when it is ready,
and serves until SIGTERM or SIGINT, when it closes every connection, removes
the socket and exits 0.`,
	Flags: []cli.Flag{
		socketFlag(),
		&cli.StringFlag{Name: "slab", Value: "64MiB", Usage: "size of a shared slab; larger allocations get a slab of their own"},
		&cli.StringSliceFlag{Name: "quota-uid", Usage: "UID=BYTES: the most the buffers a uid creates may hold at once (repeatable)"},
		&cli.StringSliceFlag{Name: "allow-uid", Usage: "UID: only these uids may connect (repeatable; default: anyone the socket's mode lets in)"},
		&cli.DurationFlag{Name: "idle", Usage: "release a shared slab that stays empty this long (0: keep empty slabs)"},
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "log slabs and connection problems on stderr"},
	},
	Action: serve,
}

func serve(c *cli.Context) error {
	if c.Args().Present() {
		return fmt.Errorf("%w: serve takes no arguments (see gpupool serve --help)", ErrUsage)
	}
	slab, err := ParseSize(c.String("slab"))
	if err != nil {
		return fmt.Errorf("--slab: %w", err)
	}
	cfg := server.Config{SlabSize: slab, Idle: c.Duration("idle")}
	if cfg.Idle < 0 {
		return fmt.Errorf("%w: --idle must not be negative", ErrUsage)
	}
	for _, q := range c.StringSlice("quota-uid") {
		uidStr, bytesStr, ok := strings.Cut(q, "=")
		uid, err := strconv.ParseUint(uidStr, 10, 32)
		if !ok || err != nil {
			return fmt.Errorf("%w: --quota-uid %q: want UID=BYTES", ErrUsage, q)
		}
		n, err := ParseSize(bytesStr)
		if err != nil {
			return fmt.Errorf("--quota-uid: %w", err)
		}
		if cfg.Quota == nil {
			cfg.Quota = map[uint32]int64{}
		}
		cfg.Quota[uint32(uid)] = n
	}
	for _, a := range c.StringSlice("allow-uid") {
		uid, err := strconv.ParseUint(a, 10, 32)
		if err != nil {
			return fmt.Errorf("%w: --allow-uid %q: want a numeric uid", ErrUsage, a)
		}
		cfg.AllowUID = append(cfg.AllowUID, uint32(uid))
	}
	logf := func(string, ...any) {}
	if c.Bool("verbose") {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	cfg.Logf = logf
	path := socketPath(c)
	l, err := ipc.Listen(path)
	if err != nil {
		if errors.Is(err, ipc.ErrSocketInUse) {
			return fmt.Errorf("a daemon is already serving %s", path)
		}
		return err
	}
	p := server.New(cfg)
	srv := &ipc.Server{Handler: p, Logf: logf}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	fmt.Fprintln(c.App.Writer, path)
	daemon.SdNotify(false, daemon.SdNotifyReady)
	select {
	case sig := <-sigs:
		logf("gpupool: %v: shutting down", sig)
		srv.Shutdown()
		<-done
		l.Close() // removes the socket file
		p.Close()
		return nil
	case err := <-done:
		srv.Shutdown()
		p.Close()
		l.Close()
		return err
	}
}
