package app

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	kit "gpukit/libgpu/cli"
	"gpukit/libgpu/ipc"
	"gpukit/tracer/internal/chrome"
	"gpukit/tracer/internal/collect"
)

var serveCommand = &cli.Command{
	Name:  "serve",
	Usage: "collect events from traced processes into a trace file",
	Description: "serve listens on --socket (SOCK_SEQPACKET), prints the socket path on stdout when ready, and " +
		"writes every event it receives to --out as it goes. Run tools with --trace SOCK or GPUKIT_TRACE=SOCK. " +
		"SIGTERM or SIGINT ends it; the file is valid JSON after any stop (a SIGKILL included: a small closer process " +
		"keeps it closable), and when the disk fills it stops writing, says so, and keeps what it wrote (exit 1). " +
		"The socket's directory must be yours and writable by no one else (mode 0700, not /tmp itself). serve owns " +
		"the socket before it touches --out, and replaces --out whole (a temporary file renamed over it), so a " +
		"refused start changes no file. Only this user, root, --allow-uid and the members of --group may send " +
		"events (SO_PEERCRED), each connection for its own process only.",
	Flags: append([]cli.Flag{
		&cli.StringFlag{Name: "socket", Aliases: []string{"s"}, Usage: "(required) socket path to listen on, in an existing directory ('@name': abstract)"},
		outFlag, maxSizeFlag, kit.ForceFlag(),
	}, kit.PeerFlags("send events")...),
	Action: runServe,
}

// session is a collector listening on a socket and writing a file.
type session struct {
	l   *net.UnixListener
	c   *collect.Collector
	out string
	err chan error
}

// startSession owns the socket first and only then touches out, which it
// replaces whole (chrome.Create writes a temporary file and renames it): a
// start refused because another collector lives on the socket leaves that
// collector's file, and any other, as it was (issue 11, item 11).
func startSession(socket, out, maxSize string, adm ipc.Admission, gid int) (*session, error) {
	capBytes, err := parseSize(maxSize)
	if err != nil {
		return nil, err
	}
	// A collector holds a descriptor per traced process.
	ipc.RaiseFDLimit()
	// Past a file size limit (ulimit -f) a write fails with EFBIG, as on
	// a full disk, instead of the signal killing the collector.
	signal.Ignore(syscall.SIGXFSZ)
	l, err := ipc.ListenWith(socket, &ipc.ListenOptions{MakeDir: true, HasGroup: gid >= 0, GID: uint32(max(gid, 0))})
	if err != nil {
		return nil, err
	}
	w, err := chrome.Create(out, capBytes, time.Second)
	if err != nil {
		l.Close()
		return nil, err
	}
	s := &session{l: l, c: collect.New(w, 0), out: out, err: make(chan error, 1)}
	s.c.Admission = adm
	s.c.MaxConns = ipc.ConnLimit()
	go func() { s.err <- s.c.Serve(l) }()
	return s, nil
}

// stop ends the session: no new connections, open ones get drain to finish,
// and the file is closed. It returns the collector's counts.
func (s *session) stop(drain time.Duration) (collect.Stats, error) {
	s.c.StopServing(s.l)
	serr := <-s.err
	s.l.Close()
	s.c.Drain(drain)
	err := s.c.Close()
	st := s.c.Stats()
	if err == nil {
		err = serr
	}
	return st, err
}

func summary(out string, st collect.Stats) string {
	line := fmt.Sprintf("tracer: wrote %d events from %d processes to %s", st.Written, st.Processes, out)
	if st.ClientDropped > 0 {
		line += fmt.Sprintf("; %d events dropped by clients", st.ClientDropped)
	}
	if st.Capped > 0 {
		line += fmt.Sprintf("; %d events over --max-size left out", st.Capped)
	}
	if st.Rejected > 0 {
		line += fmt.Sprintf("; %d batches refused", st.Rejected)
		if st.Foreign > 0 {
			line += fmt.Sprintf(" (%d for another process than their sender)", st.Foreign)
		}
	}
	if st.Refused > 0 {
		line += fmt.Sprintf("; %d connections refused (not admitted)", st.Refused)
	}
	if st.Lost > 0 {
		line += fmt.Sprintf("; %d events lost when writing stopped", st.Lost)
	}
	return line
}

func runServe(c *cli.Context) error {
	if err := kit.NoArgs(c); err != nil {
		return err
	}
	if err := kit.Require(c, "socket"); err != nil {
		return err
	}
	if err := checkOut(c); err != nil {
		return err
	}
	if _, err := kit.CheckSocketDir(c.String("socket"), true); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	adm, gid, err := kit.Admission(c)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	s, err := startSession(c.String("socket"), c.String("out"), c.String("max-size"), adm, gid)
	if err != nil {
		return err
	}
	fmt.Fprintln(c.App.Writer, c.String("socket"))
	select {
	case <-sig:
	case err := <-s.err: // the listener failed
		s.err <- err
	}
	st, err := s.stop(500 * time.Millisecond)
	fmt.Fprintln(c.App.ErrWriter, summary(s.out, st))
	return err
}
