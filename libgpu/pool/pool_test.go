package pool

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

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
