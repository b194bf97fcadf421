package ipc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	a, b, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func memfd(t *testing.T, data []byte) int {
	t.Helper()
	fd, err := unix.MemfdCreate("ipc-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, data, 0); err != nil {
		t.Fatal(err)
	}
	return fd
}

func TestFramingOverSocketpair(t *testing.T) {
	a, b := pair(t)
	r := rand.New(rand.NewPCG(3, uint64(rand.Int64())))
	for i := 0; i < 50; i++ {
		payload := make([]byte, r.IntN(MaxMessage/2))
		for j := range payload {
			payload[j] = byte(r.Uint32())
		}
		body, _ := MarshalBody(payload)
		sent := &Message{Version: Version, Type: TypeRequest, ID: uint64(i + 1), Op: "put", Flow: r.Uint64(), Body: body}
		if err := a.Send(sent); err != nil {
			t.Fatal(err)
		}
		got, fds, err := b.Recv()
		if err != nil || len(fds) != 0 {
			t.Fatalf("recv: %v %v", err, fds)
		}
		var back []byte
		if err := UnmarshalBody(got.Body, &back); err != nil || !bytes.Equal(back, payload) || got.Flow != sent.Flow || got.ID != sent.ID {
			t.Fatalf("message %d changed in transit (%v)", i, err)
		}
	}
	a.CloseWrite()
	if _, _, err := b.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after close: %v", err)
	}
}

func TestFDsCrossSocket(t *testing.T) {
	a, b := pair(t)
	want := []byte("bytes in a memfd")
	fd := memfd(t, want)
	defer unix.Close(fd)
	if err := a.Send(&Message{Version: Version, Type: TypeRequest, ID: 1, Op: "fd"}, fd); err != nil {
		t.Fatal(err)
	}
	_, fds, err := b.Recv()
	if err != nil || len(fds) != 1 {
		t.Fatalf("recv %v %v", fds, err)
	}
	defer unix.Close(fds[0])
	if fds[0] == fd {
		t.Fatalf("received fd %d is the sent fd number", fd)
	}
	got := make([]byte, len(want))
	if _, err := unix.Pread(fds[0], got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %q %v", got, err)
	}
}

func TestRecvRejectsOversizedAndTooManyFDs(t *testing.T) {
	a, b := pair(t)
	if err := a.SendRaw(make([]byte, MaxMessage+100)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Recv(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	if err := a.SendRaw(nil, make([]int, MaxFDs+1)...); !errors.Is(err, ErrTooManyFDs) {
		t.Fatalf("send too many fds: %v", err)
	}
	// Bypass the sender's check: the receiver must cut and close them.
	fd := memfd(t, []byte("x"))
	defer unix.Close(fd)
	fds := make([]int, MaxFDs+4)
	for i := range fds {
		fds[i] = fd
	}
	m, _ := Encode(&Message{Version: Version, Type: TypeRequest, ID: 1, Op: "x"})
	if _, _, err := a.uc.WriteMsgUnix(m, unix.UnixRights(fds...), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Recv(); !errors.Is(err, ErrTooManyFDs) {
		t.Fatalf("too many fds: %v", err)
	}
	// The connection still reads the next frame.
	if err := a.Send(&Message{Version: Version, Type: TypeRequest, ID: 2, Op: "y"}); err != nil {
		t.Fatal(err)
	}
	if m, _, err := b.Recv(); err != nil || m.ID != 2 {
		t.Fatalf("next frame: %+v %v", m, err)
	}
}

func TestPeerCred(t *testing.T) {
	a, _ := pair(t)
	c, err := a.PeerCred()
	if err != nil {
		t.Fatal(err)
	}
	if int(c.PID) != os.Getpid() || int(c.UID) != os.Getuid() {
		t.Fatalf("cred %+v, pid %d uid %d", c, os.Getpid(), os.Getuid())
	}
}

// The child half of TestMemfdCrossesProcesses: it runs when the test binary
// is started with GPUKIT_IPC_CHILD set, with the socket as fd 3.
func TestMain(m *testing.M) {
	if path := os.Getenv("GPUKIT_IPC_SERVE"); path != "" {
		if err := childServe(path); err != nil {
			fmt.Fprintln(os.Stderr, "child server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv("GPUKIT_IPC_CHILD") != "" {
		if err := child(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child receives a memfd, maps it, sends back what it read, and writes the
// reversed bytes after them in the shared mapping.
func child() error {
	c, err := FileConn(3)
	if err != nil {
		return err
	}
	m, fds, err := c.Recv()
	if err != nil {
		return err
	}
	if len(fds) != 1 {
		return fmt.Errorf("got %d fds", len(fds))
	}
	var n int
	if err := UnmarshalBody(m.Body, &n); err != nil {
		return err
	}
	mem, err := unix.Mmap(fds[0], 0, 2*n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	read := append([]byte(nil), mem[:n]...)
	for i := 0; i < n; i++ {
		mem[n+i] = read[n-1-i]
	}
	body, _ := MarshalBody(read)
	return c.Send(&Message{Version: Version, Type: TypeReply, ID: m.ID, Op: m.Op, Body: body})
}

func TestMemfdCrossesProcesses(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	childEnd := os.NewFile(uintptr(fds[1]), "child-socket")
	parent, err := FileConn(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GPUKIT_IPC_CHILD=1")
	cmd.ExtraFiles = []*os.File{childEnd}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	childEnd.Close()

	n := 4096 + rand.IntN(4096)
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	fd, err := unix.MemfdCreate("ipc-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(2*n)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, 2*n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	copy(mem, want)
	body, _ := MarshalBody(n)
	if err := parent.Send(&Message{Version: Version, Type: TypeRequest, ID: 1, Op: "map", Body: body}, fd); err != nil {
		t.Fatal(err)
	}
	reply, _, err := parent.Recv()
	if err != nil {
		t.Fatalf("recv from child: %v (stderr: %s)", err, stderr.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v: %s", err, stderr.String())
	}
	var read []byte
	if err := UnmarshalBody(reply.Body, &read); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read, want) {
		t.Fatalf("child read different bytes than the parent wrote")
	}
	for i := 0; i < n; i++ {
		if mem[n+i] != want[n-1-i] {
			t.Fatalf("byte %d the child wrote is %d, want %d", i, mem[n+i], want[n-1-i])
		}
	}
}

// echo is a test Handler: "echo" returns its body, "fail" returns
// ErrPermission, "fd" returns a memfd holding its body, anything else is an
// unknown op.
type echo struct {
	mu     sync.Mutex
	closed int
	deny   error
}

type echoSession struct{ e *echo }

func (e *echo) Connect(c *Conn) (Session, error) {
	if e.deny != nil {
		return nil, e.deny
	}
	return echoSession{e}, nil
}

func (s echoSession) Handle(_ context.Context, m *Message, _ []int) (any, []int, error) {
	switch m.Op {
	case "echo":
		var v any
		if err := UnmarshalBody(m.Body, &v); err != nil {
			return nil, nil, err
		}
		return v, nil, nil
	case "fail":
		return nil, nil, fmt.Errorf("test: nope: %w", ErrPermission)
	case "panic":
		panic("handler bug")
	case "fd":
		var s string
		UnmarshalBody(m.Body, &s)
		fd, err := unix.MemfdCreate("echo", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, nil, err
		}
		unix.Pwrite(fd, []byte(s), 0)
		return len(s), []int{fd}, nil
	}
	return nil, nil, fmt.Errorf("%w: %q", ErrUnknownOp, m.Op)
}

func (s echoSession) Close() { s.e.mu.Lock(); s.e.closed++; s.e.mu.Unlock() }

func startServer(t *testing.T, h Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Handler: h}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Shutdown()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return path
}

func dialClient(t *testing.T, path string) *Client {
	t.Helper()
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	cl := NewClient(c)
	t.Cleanup(func() { cl.Close() })
	return cl
}

func TestServerClient(t *testing.T) {
	e := &echo{}
	path := startServer(t, e)
	cl := dialClient(t, path)
	ctx := context.Background()

	// Concurrent calls are matched to their replies.
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				want := fmt.Sprintf("g%d-%d", g, i)
				var got string
				if _, err := cl.Call(ctx, "echo", want, &got); err != nil || got != want {
					t.Errorf("echo %q: %q %v", want, got, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()

	// Errors come back as the registered sentinel.
	_, err := cl.Call(ctx, "fail", nil, nil)
	var re *RemoteError
	if !errors.Is(err, ErrPermission) || !errors.As(err, &re) || re.Code != "permission_denied" {
		t.Fatalf("fail: %v", err)
	}
	if _, err := cl.Call(ctx, "no-such-op", nil, nil); !errors.Is(err, ErrUnknownOp) {
		t.Fatalf("unknown op: %v", err)
	}
	if _, err := cl.Call(ctx, "panic", nil, nil); !errors.Is(err, ErrInternal) {
		t.Fatalf("panicking handler: %v", err)
	}
	// The connection survives op errors, and fds come back.
	fds, err := cl.Call(ctx, "fd", "shared", nil)
	if err != nil || len(fds) != 1 {
		t.Fatalf("fd: %v %v", fds, err)
	}
	buf := make([]byte, 6)
	unix.Pread(fds[0], buf, 0)
	unix.Close(fds[0])
	if string(buf) != "shared" {
		t.Fatalf("fd holds %q", buf)
	}
}

func TestServerClosesOnMalformed(t *testing.T) {
	e := &echo{}
	path := startServer(t, e)
	good := dialClient(t, path)
	for name, frame := range map[string][]byte{
		"garbage": []byte("\xc1\xc1 not msgpack"),
		"truncated": func() []byte {
			b, _ := Encode(&Message{Version: Version, Type: TypeRequest, ID: 5, Op: "echo"})
			return b[:len(b)-2]
		}(),
		"oversized": make([]byte, MaxMessage+10),
		"version":   mustEncode(t, map[string]any{"v": Version + 1, "t": 1, "id": 5, "op": "echo"}),
	} {
		c, err := Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SendRaw(frame); err != nil {
			t.Fatal(err)
		}
		m, _, err := c.Recv()
		if err != nil && !errors.Is(err, ErrVersion) {
			t.Fatalf("%s: no error reply: %v", name, err)
		}
		if m == nil || m.Err == nil {
			t.Fatalf("%s: reply %+v is not an error", name, m)
		}
		if _, _, err := c.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("%s: connection not closed: %v", name, err)
		}
		c.Close()
		var got string
		if _, err := good.Call(context.Background(), "echo", name, &got); err != nil || got != name {
			t.Fatalf("other client after %s: %q %v", name, got, err)
		}
	}
}

func TestServerRefusedConnection(t *testing.T) {
	path := startServer(t, &echo{deny: fmt.Errorf("test: uid 5: %w", ErrPermission)})
	cl := dialClient(t, path)
	if _, err := cl.Call(context.Background(), "echo", 1, nil); !errors.Is(err, ErrPermission) {
		t.Fatalf("refused: %v", err)
	}
	<-cl.Done()
	if _, err := cl.Call(context.Background(), "echo", 1, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

func TestClientCancel(t *testing.T) {
	path := startServer(t, &echo{})
	cl := dialClient(t, path)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := cl.Call(ctx, "echo", 1, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call: %v", err)
	}
	var got int
	if _, err := cl.Call(context.Background(), "echo", 2, &got); err != nil || got != 2 {
		t.Fatalf("after cancel: %d %v", got, err)
	}
}

func TestListenSafety(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "d.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("mode %v %v", fi.Mode(), err)
	}
	// A live listener is not stolen.
	if _, err := Listen(path); !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("second listen: %v", err)
	}
	// A stale socket file (nobody listening) is replaced.
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatal("stale socket file was not kept for the test")
	}
	l2, err := Listen(path)
	if err != nil {
		t.Fatalf("listen over stale socket: %v", err)
	}
	l2.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file left after close: %v", err)
	}
	// A regular file is never removed.
	reg := filepath.Join(dir, "file")
	os.WriteFile(reg, []byte("keep"), 0o600)
	if _, err := Listen(reg); err == nil {
		t.Fatal("listened over a regular file")
	}
	if b, _ := os.ReadFile(reg); string(b) != "keep" {
		t.Fatal("regular file changed")
	}
	// A stream socket at the path is someone else's.
	sp := filepath.Join(dir, "stream.sock")
	sl, err := net.Listen("unix", sp)
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	if _, err := Listen(sp); err == nil {
		t.Fatal("listened over a live stream socket")
	}
	_ = strconv.Itoa
}
