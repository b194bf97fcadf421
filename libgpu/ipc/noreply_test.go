package ipc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"
)

// adder keeps a sum per connection: "add" adds its body, "get" returns it,
// "fd" answers with a memfd, anything else fails.
type adder struct{}

type adderSession struct{ sum *int64 }

func (adder) Connect(*Conn) (Session, error) { return adderSession{new(int64)}, nil }
func (s adderSession) Close()                {}
func (s adderSession) Handle(_ context.Context, m *Message, _ []int) (any, []int, error) {
	switch m.Op {
	case "add":
		var n int64
		if err := UnmarshalBody(m.Body, &n); err != nil {
			return nil, nil, err
		}
		*s.sum += n
		return *s.sum, nil, nil
	case "get":
		return *s.sum, nil, nil
	case "fd":
		fd, err := unix.MemfdCreate("adder", unix.MFD_CLOEXEC)
		return 0, []int{fd}, err
	}
	return nil, nil, fmt.Errorf("%w: %q", ErrUnknownOp, m.Op)
}

// A server runs NoReply requests, answers none of them (successful,
// failed, or with fds), keeps the connection open and serves in order.
func TestServerHonoursNoReply(t *testing.T) {
	path := startServer(t, adder{})
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var want int64
	id := uint64(0)
	send := func(op string, body any, noReply bool) {
		t.Helper()
		b, err := MarshalBody(body)
		if err != nil {
			t.Fatal(err)
		}
		id++
		if err := c.Send(&Message{Version: Version, Type: TypeRequest, ID: id, Op: op, Body: b, NoReply: noReply}); err != nil {
			t.Fatal(err)
		}
	}
	for range 50 {
		n := rand.Int64N(1000) - 500
		want += n
		send("add", n, true)
		send("bogus", nil, true)
		send("fd", nil, true)
	}
	send("get", nil, false)
	m, fds, err := c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	CloseFDs(fds)
	var got int64
	if err := UnmarshalBody(m.Body, &got); err != nil {
		t.Fatal(err)
	}
	if m.ID != id || m.Op != "get" || got != want || len(fds) != 0 {
		t.Fatalf("first reply: id %d op %q sum %d fds %d; want id %d get %d", m.ID, m.Op, got, len(fds), id, want)
	}
}

// Client.Tell against a server that predates NoReply (it answers every
// request): the stray replies are dropped, later Calls get their own.
func TestTellToOldServer(t *testing.T) {
	a, b := pair(t)
	cl := NewClient(a)
	defer cl.Close()
	go func() {
		for {
			m, _, err := b.Recv()
			if err != nil {
				return
			}
			r := &Message{Version: Version, Type: TypeReply, ID: m.ID, Op: m.Op, Flow: m.Flow}
			if m.NoReply {
				r.Body, _ = MarshalBody("told")
			} else {
				r.Body, _ = MarshalBody("called")
			}
			b.Send(r)
		}
	}()
	ctx := context.Background()
	for range 20 {
		if err := cl.Tell(ctx, "x", 1); err != nil {
			t.Fatal(err)
		}
		if err := cl.Tell(ctx, "x", 2); err != nil {
			t.Fatal(err)
		}
		var s string
		if _, err := cl.Call(ctx, "y", nil, &s); err != nil || s != "called" {
			t.Fatalf("call after tells: %q, %v", s, err)
		}
	}
	b.Close()
	<-cl.Done()
	if err := cl.Tell(ctx, "x", 3); !errors.Is(err, ErrClosed) {
		t.Fatalf("tell after the end: %v", err)
	}
}
