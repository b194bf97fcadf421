package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"gpukit/gpupool/internal/server"
	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
)

var serveCommand = &cli.Command{
	Name:  "serve",
	Usage: "run the pool daemon on a socket",
	Description: `serve listens on --socket (refusing a socket a live daemon answers on,
replacing a stale one), or on the socket systemd passes (LISTEN_FDS), prints
the socket path on stdout when it is ready, tells systemd READY=1, and serves
until SIGTERM or SIGINT, when it stops accepting, ends waits in progress,
closes every connection, removes the socket it made and exits 0.

On a GPU (--backend auto picks CUDA when a device answers) slabs are CUDA VMM
allocations shared as fds; on the host they are memfds, sealed against
resizing.

The socket's directory must belong to the daemon's user and be writable by
no one else (0700; 0750 with group --group for --group), else serve refuses
to start. At start the daemon raises its open file limit to the hard limit
and sizes its connection and slab limits to it (gpupool stats shows them);
past a limit a request gets an error naming it, and the daemon goes on.`,
	Flags: []cli.Flag{
		socketFlag(),
		&cli.StringFlag{Name: "backend", Value: "auto", Usage: "auto, cuda or host: where slabs live (auto: a GPU when one answers, else host memory)"},
		&cli.IntFlag{Name: "device", Usage: "CUDA device ordinal"},
		kit.SizeFlag("slab", "64MiB", "size of a shared slab (rounded up to the VMM granularity on a GPU); larger allocations get a slab of their own"),
		&cli.StringFlag{Name: "limit", Usage: "most bytes all slabs may reserve, at least one --slab: a size, N% of free device memory (cuda) or of RAM (host), or 0 for none (default: 90% on cuda, 50% on host)"},
		&cli.DurationFlag{Name: "idle", Usage: "release a shared slab that stays empty this long (0: keep empty slabs)"},
		&cli.BoolFlag{Name: "legacy-ipc", Usage: "make every buffer a cuMemAlloc buffer with a legacy CUipcMemHandle (CuPy, PyTorch); cuda only"},
		&cli.BoolFlag{Name: "ephemeral", Usage: "tie named buffers to their creator's connection instead of keeping them until rm"},
		&cli.BoolFlag{Name: "isolate", Usage: "give each uid slabs of its own and refuse to open another uid's buffers"},
		&cli.StringFlag{Name: "group", Usage: "GROUP (name or gid): the socket's group (mode 0660), and members may connect"},
		&cli.StringSliceFlag{Name: "allow-uid", Usage: "UID: only these uids (and --group's members) may connect (repeatable; default: anyone the socket's mode lets in)"},
		&cli.StringSliceFlag{Name: "quota-uid", Usage: "UID=BYTES: the most the buffers a uid creates may hold at once (repeatable)"},
		&cli.StringFlag{Name: "metrics-addr", Usage: "HOST:PORT: serve the stats as Prometheus text at /metrics"},
		&cli.IntFlag{Name: "max-conns", Usage: "most connections served at once; more are told so and closed (default: 1024, or a quarter of the open file limit if less)"},
		&cli.DurationFlag{Name: "orphan-grace", Value: server.DefaultOrphanGrace, Usage: "remove a kept buffer left unsealed by a creator that is gone (nobody can seal it any more) this long after (0: at once)"},
		&cli.BoolFlag{Name: "verbose", Aliases: []string{"v"}, Usage: "log slabs and connection problems on stderr"},
		kit.TraceFlag("a span per request and the reserved/used byte counters"),
	},
	Action: serve,
}

// source opens the slab source --backend names.
func source(c *cli.Context) (server.SlabSource, func(), error) {
	ord := c.Int("device")
	switch b := c.String("backend"); b {
	case "host":
		return server.Memfd{}, func() {}, nil
	case "cuda", "auto":
		d, err := device.NewCUDA(ord)
		if err != nil {
			if b == "auto" && device.NoGPU(err) {
				return server.Memfd{}, func() {}, nil
			}
			return nil, nil, fmt.Errorf("--backend %s: %w", b, err)
		}
		src, err := server.NewCUDA(d)
		if err != nil {
			d.Close()
			return nil, nil, err
		}
		return src, func() { d.Close() }, nil
	default:
		return nil, nil, fmt.Errorf("%w: --backend %q: want auto, cuda or host", ErrUsage, b)
	}
}

// checkMetricsAddr checks --metrics-addr's form (HOST:PORT, HOST empty,
// a name or an IP; PORT a number or a service name) before anything
// starts; whether it can be listened on is found when serve listens.
func checkMetricsAddr(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return fmt.Errorf("%w: --metrics-addr %q: want HOST:PORT, e.g. 127.0.0.1:9464 or :9464", ErrUsage, addr)
	}
	return nil
}

// parseLimit reads --limit against the memory the backend has.
func parseLimit(s string, src server.SlabSource) (int64, error) {
	var avail int64
	if cs, ok := src.(*server.CUDA); ok {
		free, _, err := cs.MemInfo()
		if err != nil {
			return 0, fmt.Errorf("--limit: device memory: %w", err)
		}
		avail = free
		if s == "" {
			s = "90%"
		}
	} else {
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err == nil {
			avail = int64(si.Totalram) * int64(si.Unit)
		}
		if s == "" {
			// A bound by default, so that a request for a huge buffer
			// cannot make the machine swap or wake the OOM killer.
			s = "50%"
		}
	}
	if s == "0" {
		return 0, nil
	}
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(pct, 64)
		if err != nil || f <= 0 || f > 100 {
			return 0, fmt.Errorf("%w: --limit %q: want a size or a percentage in (0,100]", ErrUsage, s)
		}
		return int64(float64(avail) * f / 100), nil
	}
	n, err := ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("--limit: %w", err)
	}
	return n, nil
}

// listen returns the socket systemd passed (LISTEN_FDS) or a new one at
// --socket, and the path to print. gid >= 0 is --group's: the socket's
// group, and that of a directory it makes.
func listen(c *cli.Context, gid int) (*net.UnixListener, string, error) {
	if files := activation.Files(true); len(files) > 0 {
		for _, f := range files[1:] {
			f.Close()
		}
		fl, err := net.FileListener(files[0])
		files[0].Close()
		if err != nil {
			return nil, "", fmt.Errorf("socket from systemd: %w", err)
		}
		l, ok := fl.(*net.UnixListener)
		if !ok || l.Addr().Network() != ipc.Network {
			fl.Close()
			return nil, "", fmt.Errorf("socket from systemd is %s, want a unix SOCK_SEQPACKET socket (ListenSequentialPacket=)", fl.Addr().Network())
		}
		l.SetUnlinkOnClose(false) // systemd owns the file
		return l, l.Addr().String(), nil
	}
	path := socketPath(c)
	// A socket path the user named must be in an existing directory; the
	// default one's directory is made, and that is said on stderr.
	mkdir, err := kit.CheckSocketDir(path, c.IsSet("socket") || os.Getenv("GPUKIT_POOL_SOCKET") != "")
	if err != nil {
		return nil, "", err
	}
	if mkdir != "" {
		fmt.Fprintf(c.App.ErrWriter, "gpupool: making the socket directory %s\n", mkdir)
	}
	l, err := ipc.ListenWith(path, &ipc.ListenOptions{MakeDir: true, HasGroup: gid >= 0, GID: uint32(max(gid, 0))})
	if err != nil {
		if errors.Is(err, ipc.ErrSocketInUse) {
			return nil, "", fmt.Errorf("a daemon is already serving %s", path)
		}
		return nil, "", err
	}
	return l, path, nil
}

func serve(c *cli.Context) error {
	if c.Args().Present() {
		return fmt.Errorf("%w: serve takes no arguments (see gpupool serve --help)", ErrUsage)
	}
	slab, err := ParseSize(c.String("slab"))
	if err != nil {
		return fmt.Errorf("--slab: %w", err)
	}
	// Negative --idle, --max-conns and --orphan-grace are refused as they
	// are parsed (libgpu/cli).
	cfg := server.Config{SlabSize: slab, Idle: c.Duration("idle"), LegacyAll: c.Bool("legacy-ipc"),
		Ephemeral: c.Bool("ephemeral"), Isolate: c.Bool("isolate"), MaxConns: c.Int("max-conns")}
	if g := c.Duration("orphan-grace"); g == 0 {
		cfg.OrphanGrace = -1 // at once
	} else {
		cfg.OrphanGrace = g
	}
	if err := checkMetricsAddr(c.String("metrics-addr")); err != nil {
		return err
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
	if cfg.AllowUID, err = kit.AllowUIDs(c); err != nil {
		return err
	}
	gid := -1
	if g := c.String("group"); g != "" {
		n, err := kit.LookupGroup(g)
		if err != nil {
			return err
		}
		gid = int(n)
		cfg.AllowGID = []uint32{n}
	}
	logf := func(string, ...any) {}
	if c.Bool("verbose") {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	cfg.Logf = logf
	defer kit.StartTrace(c)()
	// Every connection and slab holds a file descriptor: the limit sizes
	// the daemon's own (server.New), and running out must not stop it.
	if _, err := ipc.RaiseFDLimit(); err != nil {
		fmt.Fprintf(c.App.ErrWriter, "gpupool: %v (going on with %d)\n", err, ipc.FDLimit())
	}

	src, closeSrc, err := source(c)
	if err != nil {
		return err
	}
	defer closeSrc()
	if cfg.LegacyAll {
		if _, ok := src.(server.LegacySource); !ok {
			return fmt.Errorf("%w: --legacy-ipc needs the cuda backend (this one is %s)", ErrUsage, src.Backend())
		}
	}
	cfg.Source = src
	if cfg.Limit, err = parseLimit(c.String("limit"), src); err != nil {
		return err
	}
	if slab := device.RoundUp(cfg.SlabSize, src.Granularity()); cfg.Limit > 0 && cfg.Limit < slab {
		return fmt.Errorf("%w: --limit %s is less than one slab (--slab %s on the %s backend): no allocation could be made", ErrUsage, kit.FormatSize(cfg.Limit), kit.FormatSize(slab), src.Backend())
	}

	l, path, err := listen(c, gid)
	if err != nil {
		return err
	}
	p := server.New(cfg)
	srv := &ipc.Server{Handler: p, Logf: logf, MaxConns: p.Config().MaxConns}

	var metrics *http.Server
	if addr := c.String("metrics-addr"); addr != "" {
		ml, err := net.Listen("tcp", addr)
		if err != nil {
			l.Close()
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			server.WriteMetrics(w, p.Stats())
		})
		metrics = &http.Server{Handler: mux}
		go metrics.Serve(ml)
		logf("gpupool: metrics at http://%s/metrics", ml.Addr())
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	limit := "none"
	if cfg.Limit > 0 {
		limit = kit.FormatSize(cfg.Limit)
	}
	logf("gpupool: %s backend, slabs of %s, limit %s; at most %d connections and %d slabs under an open file limit of %d",
		src.Backend(), kit.FormatSize(p.Config().SlabSize), limit, p.Config().MaxConns, p.Config().MaxSlabs, ipc.FDLimit())
	fmt.Fprintln(c.App.Writer, path)
	daemon.SdNotify(false, daemon.SdNotifyReady)
	var serr error
	select {
	case sig := <-sigs:
		logf("gpupool: %v: draining", sig)
		daemon.SdNotify(false, daemon.SdNotifyStopping)
		srv.Shutdown()
		<-done
	case serr = <-done:
		srv.Shutdown()
	}
	if metrics != nil {
		metrics.Shutdown(context.Background())
	}
	l.Close() // removes the socket file it made
	p.Close()
	return serr
}
