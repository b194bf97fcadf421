package ipc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/ipc/ipctest"
)

// childServe is the child of the tests that need a daemon in a process of
// its own: it serves echo on path (GPUKIT_IPC_NOFILE: under that
// RLIMIT_NOFILE, soft and hard; GPUKIT_IPC_MAXCONNS: Server.MaxConns),
// prints "ready", and serves until stdin closes.
func childServe(path string) error {
	if s := os.Getenv("GPUKIT_IPC_NOFILE"); s != "" {
		n, _ := strconv.ParseUint(s, 10, 64)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			return err
		}
	}
	l, err := ListenWith(path, &ListenOptions{})
	if err != nil {
		return err
	}
	srv := &Server{Handler: &echo{}, Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }}
	srv.MaxConns, _ = strconv.Atoi(os.Getenv("GPUKIT_IPC_MAXCONNS"))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	srv.Shutdown()
	return <-done
}

// startChild runs childServe in a child process; env adds to its
// environment, cred (if not nil) sets its credentials.
func startChild(t *testing.T, path string, cred *syscall.Credential, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "GPUKIT_IPC_SERVE="+path), env...)
	if cred != nil {
		cmd.Path = ipctest.ExeForOthers(t)
		cmd.Args[0] = cmd.Path
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
		if t.Failed() {
			t.Logf("child stderr: %s", stderr.String())
		}
	})
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child: %q %v (stderr %s)", line, err, stderr.String())
	}
	return cmd
}

func abstractName(t *testing.T) string {
	return fmt.Sprintf("@gpukit-ipc-%s-%d-%d", t.Name(), os.Getpid(), rand.Uint32())
}

// A negative id in any msgpack integer form, a non-integer id and a request
// with id 0 are malformed envelopes; a server answers them with id 0 and
// closes the connection (issue 11, item 8).
func TestRequestIDs(t *testing.T) {
	frame := func(id []byte) []byte {
		b := []byte{0x84, 0xa1, 'v', 0x01, 0xa1, 't', 0x01, 0xa2, 'o', 'p', 0xa5, 'h', 'e', 'l', 'l', 'o', 0xa2, 'i', 'd'}
		return append(b, id...)
	}
	for name, id := range map[string][]byte{
		"fixint -1": {0xff},
		"int8 -100": {0xd0, 0x9c},
		"int16 -2":  {0xd1, 0xff, 0xfe},
		"int32 -5":  {0xd2, 0xff, 0xff, 0xff, 0xfb},
		"int64 min": {0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0},
		"float":     {0xcb, 0x40, 0x14, 0, 0, 0, 0, 0, 0},
		"string":    {0xa1, '5'},
		"zero":      {0x00},
		"nil":       {0xc0},
	} {
		if _, err := Decode(frame(id)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Decode: %v, want ErrMalformed", name, err)
		}
	}
	// Positive ids in wide or signed forms are fine.
	for name, c := range map[string]struct {
		id   []byte
		want uint64
	}{
		"int8 5":      {[]byte{0xd0, 0x05}, 5},
		"int64 7":     {[]byte{0xd3, 0, 0, 0, 0, 0, 0, 0, 7}, 7},
		"uint64 2^63": {[]byte{0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0}, 1 << 63},
	} {
		m, err := Decode(frame(c.id))
		if err != nil || m.ID != c.want {
			t.Errorf("%s: %+v %v", name, m, err)
		}
	}

	path := startServer(t, &echo{})
	for _, id := range [][]byte{{0xff}, {0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfb}, {0x00}} {
		c, err := Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SendRaw(frame(id)); err != nil {
			t.Fatal(err)
		}
		m, _, err := c.Recv()
		if err != nil || m.ID != 0 || m.Err == nil || m.Err.Code != "malformed" {
			t.Fatalf("id %x: reply %+v, %v; want an id 0 malformed error", id, m, err)
		}
		if _, _, err := c.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("id %x: connection left open: %v", id, err)
		}
		c.Close()
	}
}

// An unknown op as long as a frame allows gets an error reply carrying the
// request's id, and the connection stays open (issue 11, item 6).
func TestHugeUnknownOp(t *testing.T) {
	path := startServer(t, &echo{})
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, n := range []int{66 << 10, MaxMessage - 64} {
		op := strings.Repeat("é", n/2) // two bytes a character
		if err := c.Send(&Message{Version: Version, Type: TypeRequest, ID: 42, Op: op}); err != nil {
			t.Fatal(err)
		}
		m, _, err := c.Recv()
		if err != nil {
			t.Fatalf("op of %d bytes: %v", len(op), err)
		}
		if m.ID != 42 || m.Err == nil || m.Err.Code != "unknown_op" || len(m.Op) > MaxOp || !strings.HasPrefix(op, strings.TrimSuffix(m.Op, "...")) {
			t.Fatalf("op of %d bytes: reply id %d op %d bytes err %+v", len(op), m.ID, len(m.Op), m.Err)
		}
		if len(m.Err.Message) > MaxErrorMessage {
			t.Fatalf("error message of %d bytes", len(m.Err.Message))
		}
	}
	body, _ := MarshalBody("still here")
	if err := c.Send(&Message{Version: Version, Type: TypeRequest, ID: 43, Op: "echo", Body: body}); err != nil {
		t.Fatal(err)
	}
	if m, _, err := c.Recv(); err != nil || m.ID != 43 || m.Err != nil {
		t.Fatalf("after the long op: %+v %v", m, err)
	}
}

// A peer the handler refuses is told why (id 0) and closed at once: it
// keeps no descriptor in the daemon waiting for its first request (issue
// 11, item 1).
func TestRefusedAtOnce(t *testing.T) {
	e := &echo{deny: fmt.Errorf("test: uid 5: %w", ErrPermission)}
	path := startServer(t, e)
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Nothing sent: the refusal comes anyway, then the end.
	m, _, err := c.Recv()
	if err != nil || m.ID != 0 || m.Err == nil || !errors.Is(FromWire(m.Err), ErrPermission) {
		t.Fatalf("refusal: %+v %v", m, err)
	}
	if _, _, err := c.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the refusal: %v", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed != 0 {
		t.Fatalf("%d sessions closed; none was made", e.closed)
	}
}

// Past MaxConns a connection is told the limit and closed; closing another
// makes room.
func TestMaxConns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Handler: &echo{}, MaxConns: 2}
	go srv.Serve(l)
	defer srv.Shutdown()
	a := dialClient(t, path)
	b := dialClient(t, path)
	for _, cl := range []*Client{a, b} {
		if _, err := cl.Call(context.Background(), "echo", 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	c := dialClient(t, path)
	_, err = c.Call(context.Background(), "echo", 1, nil)
	if !errors.Is(err, ErrLimit) || !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "2 connections") {
		t.Fatalf("third connection: %v", err)
	}
	a.Close()
	for { // the server sees a's end when it reads it
		d := dialClient(t, path)
		_, err := d.Call(context.Background(), "echo", 1, nil)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrLimit) {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
}

// A daemon out of file descriptors keeps serving: connections it cannot
// accept are told so and closed (a descriptor is kept for that), accept
// retries, and once clients leave it serves new ones (issue 11, item 1).
// The daemon is a child process under a low RLIMIT_NOFILE.
func TestFDExhaustion(t *testing.T) {
	const nofile = 48
	path := filepath.Join(t.TempDir(), "fd.sock")
	cmd := startChild(t, path, nil, "GPUKIT_IPC_NOFILE="+strconv.Itoa(nofile), "GPUKIT_IPC_MAXCONNS=100000")
	var conns []*Client
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	served, refused := 0, 0
	for i := 0; i < 3*nofile; i++ {
		conn, err := Dial(path)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		c := NewClient(conn)
		conns = append(conns, c)
		var got int
		_, err = c.Call(context.Background(), "echo", i, &got)
		switch {
		case err == nil && got == i:
			served++
		case errors.Is(err, ErrLimit) && strings.Contains(err.Error(), "out of file descriptors"):
			refused++
		case errors.Is(err, ErrClosed):
			// Accepted with the reserve descriptor while another was shed.
			refused++
		default:
			t.Fatalf("connection %d: %d, %v", i, got, err)
		}
	}
	if served == 0 || refused == 0 || served >= nofile {
		t.Fatalf("%d served, %d refused under %d descriptors", served, refused, nofile)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	for { // the daemon sees the ends as it reads them
		cl := dialClient(t, path)
		var got string
		_, err := cl.Call(context.Background(), "echo", "back", &got)
		if err == nil && got == "back" {
			break
		}
		if !errors.Is(err, ErrLimit) && !errors.Is(err, ErrClosed) {
			t.Fatal(err)
		}
		cl.Close()
		time.Sleep(5 * time.Millisecond)
	}
	if cmd.ProcessState != nil {
		t.Fatal("the daemon exited")
	}
	t.Logf("%d served, %d refused", served, refused)
}

// hangWaiter is a Handler whose "wait" op blocks until released or until its
// client hangs up (WatchHangup), and whose "hold" op blocks until then.
type hangWaiter struct {
	release chan struct{}
	waiting chan struct{}
	ended   chan error
}

func (w *hangWaiter) Connect(*Conn) (Session, error) { return w, nil }
func (w *hangWaiter) Close()                         {}
func (w *hangWaiter) Handle(ctx context.Context, m *Message, _ []int) (any, []int, error) {
	switch m.Op {
	case "wait", "hold":
		ctx, stop := WatchHangup(ctx)
		defer stop()
		release := w.release
		if m.Op == "hold" {
			release = nil // until the client hangs up
		}
		w.waiting <- struct{}{}
		select {
		case <-release:
			w.ended <- nil
			return "released", nil, nil
		case <-ctx.Done():
			err := context.Cause(ctx)
			w.ended <- err
			return nil, nil, err
		}
	case "echo":
		var v any
		UnmarshalBody(m.Body, &v)
		return v, nil, nil
	}
	return nil, nil, ErrUnknownOp
}

// A handler waiting under WatchHangup ends as soon as its client closes
// the connection, and not when the client merely sends another request
// (issue 11, item 2).
func TestWatchHangup(t *testing.T) {
	w := &hangWaiter{release: make(chan struct{}), waiting: make(chan struct{}, 1), ended: make(chan error, 1)}
	path := startServer(t, w)
	cl := dialClient(t, path)
	// A pipelined request does not end the wait; the release does.
	res := make(chan string, 1)
	go func() {
		var s string
		cl.Call(context.Background(), "wait", nil, &s)
		res <- s
	}()
	<-w.waiting
	echoed := make(chan error, 1)
	go func() {
		var s string
		_, err := cl.Call(context.Background(), "echo", "behind", &s)
		echoed <- err
	}()
	select {
	case err := <-w.ended:
		t.Fatalf("the wait ended before its release: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(w.release)
	if err := <-w.ended; err != nil {
		t.Fatal(err)
	}
	if s := <-res; s != "released" {
		t.Fatalf("wait returned %q", s)
	}
	if err := <-echoed; err != nil {
		t.Fatal(err)
	}
	// A client that hangs up ends the wait at once.
	conn, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Send(&Message{Version: Version, Type: TypeRequest, ID: 1, Op: "hold"}); err != nil {
		t.Fatal(err)
	}
	<-w.waiting
	conn.Close()
	if err := <-w.ended; !errors.Is(err, ErrClosed) {
		t.Fatalf("wait ended with %v, want the hang-up", err)
	}
}

// silent accepts connections on path and reads their requests without
// answering, but for op "slow", answered after delay, and op "after",
// answered at once.
func silent(t *testing.T, delay time.Duration) string {
	path := filepath.Join(t.TempDir(), "silent.sock")
	l, err := ListenWith(path, &ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			uc, err := l.AcceptUnix()
			if err != nil {
				return
			}
			c := NewConn(uc)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				for {
					m, _, err := c.Recv()
					if err != nil {
						return
					}
					switch m.Op {
					case "slow":
						time.Sleep(delay)
						fallthrough
					case "after":
						c.Send(&Message{Version: Version, Type: TypeReply, ID: m.ID, Op: m.Op})
					}
				}
			}()
		}
	}()
	return path
}

// A daemon that never answers cannot hang a client: the call fails with
// ErrTimeout and the connection is closed (issue 11, item 10).
func TestClientTimeout(t *testing.T) {
	path := silent(t, 0)
	cl := dialClient(t, path)
	cl.SetTimeout(40 * time.Millisecond)
	_, err := cl.Call(context.Background(), "stats", nil, nil)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "no reply to stats") {
		t.Fatalf("call to a silent daemon: %v", err)
	}
	if _, err := cl.Call(context.Background(), "stats", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after the timeout: %v", err)
	}
	// Go requests are covered too.
	cl2 := dialClient(t, path)
	cl2.SetTimeout(40 * time.Millisecond)
	got := make(chan *Message, 1)
	if err := cl2.Go(context.Background(), "free", nil, func(m *Message, _ []int) { got <- m }); err != nil {
		t.Fatal(err)
	}
	if m := <-got; m != nil {
		t.Fatalf("Go got %+v", m)
	}
	if !errors.Is(cl2.Err(), ErrTimeout) {
		t.Fatalf("Go: %v", cl2.Err())
	}
}

// A call with its own deadline (an open that waits) is not cut by the
// watchdog, nor are calls queued behind it; the deadline bounds it.
func TestClientOwnDeadline(t *testing.T) {
	// The slow reply takes several watchdog periods; the one behind it
	// comes at once after it, well within one (a loaded machine's delays
	// are far shorter than 100 ms).
	path := silent(t, 600*time.Millisecond)
	cl := dialClient(t, path)
	cl.SetTimeout(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	behind := make(chan error, 1)
	go func() {
		time.Sleep(5 * time.Millisecond)
		_, err := cl.Call(context.Background(), "after", nil, nil)
		behind <- err
	}()
	if _, err := cl.Call(ctx, "slow", nil, nil); err != nil {
		t.Fatalf("slow call with its own deadline: %v", err)
	}
	if err := <-behind; err != nil {
		t.Fatalf("call queued behind it: %v", err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	if _, err := cl.Call(short, "never", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call past its deadline: %v", err)
	}
}

// The listener's uid decides whether a client talks to it (issue 11,
// item 4).
func TestCheckPeer(t *testing.T) {
	self := uint32(os.Geteuid())
	other := self + 1 + rand.Uint32N(1000)
	if other == 0 {
		other = 1
	}
	for _, c := range []struct {
		cred  Cred
		trust []uint32
		ok    bool
	}{
		{Cred{UID: self}, nil, true},
		{Cred{UID: 0}, nil, true},
		{Cred{UID: other}, nil, false},
		{Cred{UID: other}, []uint32{other}, true},
		{Cred{UID: other}, []uint32{other + 1}, false},
	} {
		err := CheckPeer(c.cred, c.trust)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrUntrusted)) {
			t.Errorf("%+v trusting %v: %v", c.cred, c.trust, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Log("not root: no daemon of another uid to dial")
		return
	}
	// A daemon run by nobody on an abstract socket (which anyone may bind).
	path := abstractName(t)
	startChild(t, path, &syscall.Credential{Uid: 65534, Gid: 65534})
	_, err := Dial(path)
	if !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "uid 65534") {
		t.Fatalf("dial a nobody's daemon: %v", err)
	}
	c, err := DialWith(path, DialOptions{TrustUIDs: []uint32{65534}})
	if err != nil {
		t.Fatalf("dial trusting nobody: %v", err)
	}
	cl := NewClient(c)
	defer cl.Close()
	var got int
	if _, err := cl.Call(context.Background(), "echo", 7, &got); err != nil || got != 7 {
		t.Fatalf("echo: %d %v", got, err)
	}
}

// A daemon listens only in a directory no other user can change (issue
// 11, items 4 and 5).
func TestListenDirSafety(t *testing.T) {
	base := t.TempDir()
	// A missing directory is made 0700 (0750 with a group, group set).
	p := filepath.Join(base, "made", "s.sock")
	o := &ListenOptions{MakeDir: true}
	l, err := ListenWith(p, o)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if fi, err := os.Stat(filepath.Dir(p)); err != nil || fi.Mode().Perm() != 0o700 || !o.Created {
		t.Fatalf("made directory: %v %v (created %v)", fi.Mode(), err, o.Created)
	}
	gid := uint32(os.Getgid())
	p = filepath.Join(base, "group", "s.sock")
	l, err = ListenWith(p, &ListenOptions{MakeDir: true, HasGroup: true, GID: gid})
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Dir(p))
	if fi.Mode().Perm() != 0o750 || fi.Sys().(*syscall.Stat_t).Gid != gid {
		t.Fatalf("group directory: %v gid %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Gid)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o660 || fi.Sys().(*syscall.Stat_t).Gid != gid {
		t.Fatalf("group socket: %v", fi.Mode())
	}
	l.Close()
	// Without MakeDir a missing directory is an error.
	if _, err := ListenWith(filepath.Join(base, "none", "s.sock"), &ListenOptions{}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing directory: %v", err)
	}
	refused := func(name, dir, want string) {
		t.Helper()
		_, err := Listen(filepath.Join(dir, "s.sock"))
		if !errors.Is(err, ErrUnsafeSocket) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want ErrUnsafeSocket saying %q", name, err, want)
		}
		if _, err := os.Lstat(filepath.Join(dir, "s.sock")); err == nil {
			t.Errorf("%s: a socket was made", name)
		}
	}
	for _, mode := range []os.FileMode{0o777, 0o770, 0o702, 0o1777} {
		d := filepath.Join(base, fmt.Sprintf("mode%o", mode))
		os.Mkdir(d, 0o700)
		os.Chmod(d, mode)
		refused(fmt.Sprintf("mode %o", mode), d, "others can write")
	}
	// A group directory the group cannot search.
	d := filepath.Join(base, "nogroup")
	os.Mkdir(d, 0o700)
	if _, err := ListenWith(filepath.Join(d, "s.sock"), &ListenOptions{HasGroup: true, GID: gid}); !errors.Is(err, ErrUnsafeSocket) {
		t.Errorf("0700 directory with --group: %v", err)
	}
	// A symbolic link to a good directory.
	link := filepath.Join(base, "link")
	os.Symlink(filepath.Join(base, "made"), link)
	refused("symlink", link, "symbolic link")
	// Another user's directory.
	if os.Geteuid() == 0 {
		foreign := filepath.Join(base, "foreign")
		os.Mkdir(foreign, 0o700)
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refused("owned by nobody", foreign, "belongs to uid 65534")
	} else {
		refused("owned by root", "/", "belongs to uid 0")
	}
}

// Linux reports a peer that closed with messages of ours unread as a reset
// before handing over what the peer sent: Recv reads those messages (the
// peer's last word), then the end.
func TestRecvAfterReset(t *testing.T) {
	a, b := pair(t)
	if err := a.Send(&Message{Version: Version, Type: TypeRequest, ID: 1, Op: "hello"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(&Message{Version: Version, Type: TypeReply, Op: "error", Err: ToWire(ErrPermission)}); err != nil {
		t.Fatal(err)
	}
	b.Close() // with a's hello unread
	m, _, err := a.Recv()
	if err != nil || m.Err == nil || m.Err.Code != "permission_denied" {
		t.Fatalf("last word: %+v %v", m, err)
	}
	if _, _, err := a.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("then: %v", err)
	}
}

// A frame of the trace protocol (a tracer collector's socket) is named as
// such.
func TestDecodeNamesTracer(t *testing.T) {
	_, err := Decode([]byte("GKT1\x01\x02\x03\x04"))
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "tracer") {
		t.Fatalf("trace batch: %v", err)
	}
}
