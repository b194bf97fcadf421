package pool

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gpukit/libgpu/device"
	"gpukit/libgpu/ipc"
)

// The pool daemon's behaviour is tested in gpupool (with this client and
// real processes); here, the client's own checks against a fake daemon.

func TestDialUnreachable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.sock")
	_, err := Dial(path)
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "gpupool serve --socket "+path) {
		t.Fatalf("got %v", err)
	}
}

type fake struct{ hello HelloReply }

func (f fake) Connect(*ipc.Conn) (ipc.Session, error) { return f, nil }
func (f fake) Close()                                 {}
func (f fake) Handle(_ context.Context, m *ipc.Message, _ []int) (any, []int, error) {
	switch m.Op {
	case OpHello:
		return f.hello, nil, nil
	case OpAlloc:
		// A lease that claims an fd but sends none.
		return Lease{Handle: 1, Slab: 1, SlabSize: 4096, Size: 10, FD: true}, nil, nil
	case OpFree:
		return nil, nil, nil
	}
	return nil, nil, ipc.ErrUnknownOp
}

func serveFake(t *testing.T, f fake) string {
	path := filepath.Join(t.TempDir(), "fake.sock")
	l, err := ipc.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &ipc.Server{Handler: f}
	go srv.Serve(l)
	t.Cleanup(srv.Shutdown)
	return path
}

func TestDialChecksServer(t *testing.T) {
	path := serveFake(t, fake{HelloReply{Server: "tracer"}})
	if _, err := Dial(path); !errors.Is(err, ErrProtocol) {
		t.Fatalf("non-pool server: %v", err)
	}
}

func TestBadLeaseIsProtocolError(t *testing.T) {
	path := serveFake(t, fake{HelloReply{Server: "gpupool", Share: 1}})
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Alloc("", 10); !errors.Is(err, ErrProtocol) {
		t.Fatalf("lease without its fd: %v", err)
	}
	if _, err := c.Alloc("", 0); !errors.Is(err, ErrBadSize) {
		t.Fatalf("size 0: %v", err)
	}
	if _, err := c.Open(""); !errors.Is(err, ErrBadName) {
		t.Fatalf("open empty name: %v", err)
	}
}

// A memfd slab that could be resized under this client (by another
// client: truncation kills with SIGBUS) is refused (issue 11, item 3).
func TestUnsealedSlabRefused(t *testing.T) {
	path := serveHandler(t, &slabber{unsealed: true, slab: 1, next: 100, sent: map[uint64]bool{}})
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Alloc("", 100); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "not sealed") {
		t.Fatalf("unsealed slab: %v", err)
	}
}

// A socket whose server never answers (another service, or a hung daemon)
// fails the hello within the client's deadline, saying it is not a
// gpupool socket (issue 11, item 10).
func TestDialSilentSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "silent.sock")
	l, err := ipc.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(io.Discard, c) }()
		}
	}()
	_, err = DialOptions(path, Options{Timeout: 30 * time.Millisecond})
	if !errors.Is(err, ErrProtocol) || !errors.Is(err, ipc.ErrTimeout) || !strings.Contains(err.Error(), "not a gpupool socket") {
		t.Fatalf("silent socket: %v", err)
	}
}

// lister is a fake daemon whose ls pages do not advance.
type lister struct{ fake }

func (f lister) Connect(*ipc.Conn) (ipc.Session, error) { return f, nil }
func (f lister) Handle(ctx context.Context, m *ipc.Message, fds []int) (any, []int, error) {
	if m.Op == OpLs {
		return LsReply{Buffers: []BufferInfo{{Name: "a", Size: 1}}, Next: "n:a"}, nil, nil
	}
	return f.fake.Handle(ctx, m, fds)
}

// A listing whose cursor does not advance is a protocol error, not a loop.
func TestLsCursorMustAdvance(t *testing.T) {
	path := serveHandler(t, lister{fake{HelloReply{Server: "gpupool", Share: 1}}})
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if bufs, err := c.Ls(); !errors.Is(err, ErrProtocol) || len(bufs) != 2 {
		t.Fatalf("ls: %d buffers, %v", len(bufs), err)
	}
}

// $GPUKIT_POOL_UID lists uids the client trusts besides its own and root.
func TestTrustUIDs(t *testing.T) {
	t.Setenv(EnvTrustUIDs, "1001, 1002")
	got, err := trustUIDs()
	if err != nil || len(got) != 2 || got[0] != 1001 || got[1] != 1002 {
		t.Fatalf("%v %v", got, err)
	}
	t.Setenv(EnvTrustUIDs, "bob")
	if _, err := Dial(filepath.Join(t.TempDir(), "x.sock")); err == nil || !strings.Contains(err.Error(), EnvTrustUIDs) {
		t.Fatalf("bad uid list: %v", err)
	}
}

// A daemon that names another protocol version is refused.
func TestDialChecksProtocol(t *testing.T) {
	path := serveFake(t, fake{HelloReply{Server: "gpupool", Protocol: ipc.Version + 1, Share: 1}})
	if _, err := Dial(path); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "speaks protocol") {
		t.Fatalf("other protocol: %v", err)
	}
}

// TestHandoverAdopt (issue 22): a connection handed over is adopted only
// when it reaches the daemon the adopting client reaches and the daemon
// sees the expected uid at its end.
func TestHandoverAdopt(t *testing.T) {
	uid := uint32(os.Geteuid())
	hello := HelloReply{Server: "gpupool", Share: device.ShareMemfd, UID: uid}
	a := serveFake(t, fake{hello})
	b := serveFake(t, fake{hello})
	c, err := Dial(a)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other, err := Dial(b)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	adopt := func(from *Client, as uint32) (*Client, error) {
		f, err := from.Handover()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fd, err := unix.Dup(int(f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		return c.Adopt(fd, as, Options{})
	}
	nc, err := adopt(c, uid)
	if err != nil {
		t.Fatalf("a connection to the same daemon: %v", err)
	}
	if nc.Path() != a || nc.Hello().UID != uid {
		t.Fatalf("adopted: %s %+v", nc.Path(), nc.Hello())
	}
	nc.Close()
	if _, err := adopt(other, uid); !errors.Is(err, ipc.ErrPermission) {
		t.Fatalf("a connection to another daemon: %v", err)
	}
	if _, err := adopt(c, uid+1); !errors.Is(err, ipc.ErrPermission) {
		t.Fatalf("a connection of another uid: %v", err)
	}
	x, y, err := ipc.Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer y.Close()
	xf, _ := x.File()
	x.Close()
	xfd, _ := unix.Dup(int(xf.Fd()))
	xf.Close()
	if _, err := c.Adopt(xfd, uid, Options{}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a socketpair: %v", err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[1])
	if _, err := c.Adopt(p[0], uid, Options{}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a pipe: %v", err)
	}
}
